"""The KV transports by name (`serve --transport`), and `make_transport`, which makes one."""

from __future__ import annotations

from typing import TYPE_CHECKING

import zmq

from ...errors import UserError
from ..curve import CurveKeys
from ..protocol import Codec
from .collective import CollectiveTransport
from .transports import KVTransport, LocalTransport, SlotIds, TcpTransport

if TYPE_CHECKING:
    import torch

    from ..shm import SharedKVRegion

TRANSPORTS = {"tcp": TcpTransport, "local": LocalTransport, "nccl": CollectiveTransport}


def make_transport(name: str, ctx: zmq.Context, codec: Codec, host: str, region: SharedKVRegion | None = None,
                   max_message: int = 1 << 30, slot_ids: SlotIds | None = None,
                   curve: CurveKeys | None = None, device: str | torch.device | None = None,
                   timeout_s: float = 30.0) -> KVTransport:
    """The transport `name` (tcp, local, nccl); `region` and `slot_ids`: see LocalTransport; `curve`:
    the cluster's CURVE keys when its sockets are encrypted; `device` (nccl): the engine's device
    (None: an echo worker), `timeout_s` (nccl): how long one send or receive may wait for its peer."""
    if name == "tcp":
        return TcpTransport(ctx, codec, host, max_message, curve)
    if name == "local":
        return LocalTransport(ctx, codec, host, region, max_message, slot_ids, curve)
    if name == "nccl":
        return CollectiveTransport(ctx, codec, host, max_message, curve, device, timeout_s)
    raise UserError(f"unknown KV transport {name!r}; use {', '.join(TRANSPORTS)}")
