"""KV transports: the sockets and puts that move K/V between workers (paper §IV-C).

Every transport has one small interface (`KVTransport`): a worker binds an inbound endpoint
(`address`) for signed messages from its peers, `send`s messages to a peer by id, `put`s K/V
where a peer can read it, polls its inbound messages (`recv_all`), and drops a peer that went down.

- `tcp` (`TcpTransport`, the default; works across hosts): the K/V bytes travel inside the
  messages (ZeroMQ over TCP) and the receiver writes them into the blocks it reserved.
- `local` (`LocalTransport`, workers on one host): every worker's KV cache lives in memory its
  peers can map (shm.py: POSIX shared memory on CPU, CUDA IPC on GPU). The prompt worker WRITES
  each layer's K/V straight into the token worker's reserved blocks (a one-sided write, like
  NVLink/RDMA in the paper) and then sends only a small control message over the same ZeroMQ
  channel ("layer i written", the closing `kvd`). The receiver copies nothing. The token worker's
  region handle travels once, in its `hello` (the router keeps it); its block ids for a request
  travel `reserved` -> router -> `gen` (prefill), which also carries the handle: together they
  are the transfer's opaque "where to write" (`Target.where`). A writer maps a peer's region on
  first use and maps it again if the peer was restarted; the slot ids of the blocks come from
  its own engine (`kv_slot_ids`, the KV-connector contract's KVHost: same model, same block
  size, checked against the peer's region). A mapping is dropped when the router says
  `peer_down` for its owner. The CUDA branch has not been run on a GPU yet.
- `nccl` (collective.py's CollectiveTransport): the K/V bytes move by torch.distributed
  point-to-point send/recv (NCCL on CUDA, gloo on CPU), the control messages as with tcp.
`make_transport` (factory.py) makes the one a worker asks for.

With `curve` (serve/curve.py) the ZeroMQ sockets of both are encrypted: the inbound ROUTER is a
CURVE server, each DEALER to a peer its client. The one-sided writes of `local` stay in this
host's memory and are not encrypted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import zmq

from ...errors import UserError
from ..curve import CurveKeys
from ..protocol import BadMessage, Codec, limit_socket

if TYPE_CHECKING:  # torch is imported where K/V is touched: echo workers and the router never do
    import torch

    from ..shm import SharedKVRegion
    from ..shm_map import MappedRegion

SlotIds = Callable[[list[int], int], "torch.Tensor"]  # (block ids, tokens) -> slot ids: KVHost.kv_slot_ids


class TransportUnavailable(UserError):
    """The requested KV transport cannot run here."""


class TransportError(Exception):
    """One transfer cannot proceed (its plan fails; the receiver hears it in `kvd`)."""


@dataclass(slots=True)
class Target:
    """Where one request's KV goes: the peer (its id, and its identity, which our messages are
    signed for), its inbound address, and for a one-sided transport `where`: the peer's KV region
    (a RegionHandle on the wire, "region") and the blocks it reserved there ("blocks")."""

    peer: int
    ident: str
    address: str
    where: dict | None = None
    slots: torch.Tensor | None = field(default=None, repr=False)  # cached destination slot ids (one-sided)
    skip: int = 0  # the K/V put starts at this prompt position (the peer holds those before it)


@dataclass(slots=True)
class Put:
    """What a `put` made of the K/V: data frames for the announcing message (tcp), the bytes
    already written into the peer's blocks (one-sided), and the whole KV's shape (`meta`: tcp,
    all layers at once)."""

    frames: list = field(default_factory=list)
    inplace_bytes: int | None = None
    meta: dict | None = None


class KVTransport:
    """The one interface of every KV transport (see the module docstring)."""

    name = "abstract"
    address: str
    inbound: zmq.Socket
    region: dict | None = None  # this worker's KV cache as a same-host peer maps it (hello)
    one_sided = False            # peers write K/V into our blocks; messages carry no K/V bytes

    def send(self, target: Target, header: dict, *data) -> bool:
        raise NotImplementedError

    def put(self, target: Target, layer: int | None, kv: torch.Tensor) -> Put:
        """Make `kv` available to `target`: layer `layer`'s K/V (2, tokens, kv_heads, head_dim),
        or every layer's (layers, 2, tokens, kv_heads, head_dim) when `layer` is None.
        TransportError when it cannot."""
        raise NotImplementedError

    def recv_all(self) -> list[tuple[dict, list]]:
        raise NotImplementedError

    def drop_peer(self, peer: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class TcpTransport(KVTransport):
    """A ROUTER socket bound on `host` receives; one DEALER per peer sends. Sends never block: a
    peer that cannot take more (down, or its queue full) loses the message and its transfer
    times out on the receiving side. K/V bytes travel in the messages."""

    name = "tcp"

    def __init__(self, ctx: zmq.Context, codec: Codec, host: str = "127.0.0.1",
                 max_message: int = 1 << 30, curve: CurveKeys | None = None) -> None:
        """max_message: bytes of the largest message part a peer may send (a whole request's KV);
        curve: the cluster's CURVE keys when its sockets are encrypted."""
        self.ctx, self.codec, self.curve = ctx, codec, curve
        self.inbound = ctx.socket(zmq.ROUTER)
        self.inbound.setsockopt(zmq.LINGER, 0)
        limit_socket(self.inbound, max_message, hwm=100_000)
        if curve is not None:
            curve.server(self.inbound)
        port = self.inbound.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self.peers: dict[int, zmq.Socket] = {}
        self.dropped = 0

    def _peer(self, peer: int, address: str) -> zmq.Socket:
        s = self.peers.get(peer)
        if s is None:
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 100_000)
            s.setsockopt(zmq.IMMEDIATE, 0)
            if self.curve is not None:
                self.curve.client(s)
            s.connect(address)
            self.peers[peer] = s
        return s

    def send(self, target: Target, header: dict, *data) -> bool:
        try:
            frames = self.codec.encode(header, *data, to=target.ident)
            self._peer(target.peer, target.address).send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            self.dropped += 1
            return False

    def put(self, target: Target, layer: int | None, kv: torch.Tensor) -> Put:
        import torch

        buf = kv.detach().contiguous().cpu()
        meta = None
        if layer is None:
            layers, _, tokens, kvh, hd = buf.shape
            meta = {"num_layers": layers, "num_tokens": tokens, "num_kv_heads": kvh, "head_dim": hd,
                    "dtype": str(buf.dtype).removeprefix("torch.")}
        return Put([buf.view(torch.uint8).numpy()], meta=meta)  # raw bytes: numpy has no bfloat16

    def recv_all(self) -> list[tuple[dict, list]]:
        out: list[tuple[dict, list]] = []
        while True:
            try:
                frames = self.inbound.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return out
            try:
                out.append(self.codec.decode(frames[1:]))  # frames[0]: the sender's identity
            except BadMessage:
                pass  # counted by the codec

    def drop_peer(self, peer: int) -> None:
        s = self.peers.pop(peer, None)
        if s is not None:
            s.close(linger=0)  # discards whatever was still queued for it

    def close(self) -> None:
        for p in list(self.peers):
            self.drop_peer(p)
        self.inbound.close(linger=0)


class LocalTransport(TcpTransport):
    """Workers on one host: `put` writes into the target's KV cache, mapped from its region handle
    (shm_map.MappedRegion), and the ZeroMQ messages carry only control (`inplace`: bytes written).
    This worker's own cache must have been allocated by `region` (a SharedKVRegion); `slot_ids`
    is its engine's KVHost.kv_slot_ids (block ids -> slot ids, for the peer's cache of the same
    layout)."""

    name = "local"
    one_sided = True

    def __init__(self, ctx: zmq.Context, codec: Codec, host: str = "127.0.0.1",
                 region: SharedKVRegion | None = None, max_message: int = 1 << 30,
                 slot_ids: SlotIds | None = None, curve: CurveKeys | None = None) -> None:
        if region is None or region.handle is None:
            raise TransportUnavailable("--transport local needs the worker's KV cache in shared memory "
                                       "(a SharedKVRegion); echo workers have none: use --transport tcp")
        if slot_ids is None:
            raise TransportUnavailable("--transport local needs the engine's kv_slot_ids")
        super().__init__(ctx, codec, host, max_message, curve)
        self.region = region.handle.to_wire()
        self.block_size = region.handle.shape[3]  # (layers, 2, blocks + 1, block_size, kv_heads, head_dim)
        self.slot_ids = slot_ids
        self.mapped: dict[int, MappedRegion] = {}

    def _mapped(self, target: Target) -> tuple[MappedRegion, list[int]]:
        from ..shm import RegionHandle, RegionUnavailable
        from ..shm_map import MappedRegion

        where = target.where or {}
        if where.get("region") is None or where.get("blocks") is None:
            raise TransportError("the token worker sent no KV region or block ids (is it on --transport local?)")
        try:
            handle = RegionHandle.from_wire(where["region"])
            m = self.mapped.get(target.peer)
            if m is not None and m.key != handle.key:  # the peer was restarted: a new region
                self.mapped.pop(target.peer).close()
                m = None
            if m is None:
                m = self.mapped[target.peer] = MappedRegion(handle)
        except RegionUnavailable as e:
            raise TransportError(str(e)) from None
        return m, where["blocks"]

    def _slots(self, target: Target, blocks: list[int], dst: torch.Tensor, tokens: int) -> torch.Tensor:
        import torch

        if target.slots is None or target.slots.numel() != tokens:
            nb, bs = dst.shape[2] - 1, dst.shape[3]  # the last block is the peer's null block
            if bs != self.block_size:
                raise TransportError(f"the token worker's blocks hold {bs} tokens, ours {self.block_size}")
            end = target.skip + tokens  # positions skip.. (those before are in the peer's cache)
            if len(blocks) * bs < end or any(not 0 <= b < nb for b in blocks):
                raise TransportError(f"the token worker's blocks {blocks[:8]}... do not hold {end} tokens "
                                     f"in its {nb} blocks")
            with torch.inference_mode(False):  # cached across steps, in and out of inference mode
                target.slots = self.slot_ids(blocks, end)[target.skip:].to(dst.device)
        return target.slots

    def put(self, target: Target, layer: int | None, kv: torch.Tensor) -> Put:
        import torch

        m, blocks = self._mapped(target)
        dst = m.tensor
        assert dst is not None  # open: _mapped drops a closed region
        lead = (dst.shape[0], 2) if layer is None else (2,)
        if (kv.dtype != dst.dtype or tuple(kv.shape[:len(lead)]) != lead
                or tuple(kv.shape[-2:]) != tuple(dst.shape[-2:]) or (layer is not None and layer >= dst.shape[0])):
            raise TransportError(f"KV {tuple(kv.shape)} {kv.dtype} does not fit the token worker's cache "
                                 f"{tuple(dst.shape)} {dst.dtype}")
        tokens = kv.shape[-3]
        slots = self._slots(target, blocks, dst, tokens)
        src = kv.to(dst.device)
        if layer is None:
            dst.view(dst.shape[0], 2, -1, *dst.shape[-2:])[:, :, slots] = src
        else:
            dst[layer].view(2, -1, *dst.shape[-2:])[:, slots] = src
        if dst.is_cuda:  # the bytes are in the peer's memory before the message says so
            torch.cuda.current_stream(dst.device).synchronize()
        return Put(inplace_bytes=kv.numel() * kv.element_size())

    def drop_peer(self, peer: int) -> None:
        super().drop_peer(peer)
        m = self.mapped.pop(peer, None)
        if m is not None:
            m.close()

    def close(self) -> None:
        super().close()
        for p in list(self.mapped):
            self.mapped.pop(p).close()
