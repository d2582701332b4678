"""The prompt worker's end of a KV transfer: `KVSender`, the sending half of the worker's KV
connector (engine/kv_connector.py; the engine calls it, it never reaches into the engine).

The router's `gen` (kind prefill) names the token worker that reserved room for the request, and
the sender keeps it as the request's plan (`plan`). Then, driven by the engine's step:
- `start_step`: a step that holds a planned prompt starts. Each such request's token worker gets
  `kvs` ("a step of your prompt starts": its transfer clock restarts). For the prompts that finish
  in this step, the policy's `choose_mode` picks layer-wise or serialized from the step's prompt
  tokens (threshold 512 by default, as in the paper).
- Layer-wise: `save_layer` gets layer i's K/V of every streamed prompt right after layer i has
  run, and puts it (tcp: sent, ZeroMQ's I/O thread ships it while the next layers compute;
  local: written into the peer's blocks), announced by `kvl`.
- `request_finished`, after the step: serialized, the whole cache goes out now; then `kvd` closes
  the transfer, stamped with the time the prefill ended (and `fail` if a put failed).
- `request_dropped`, a plan dropped before its `kvd` (abort, a failed step, or the request ended
  at its first token): on a one-sided transport it sends `kvx` ("I will not write this request's
  blocks again").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...engine.kv_connector import PromptChunk, PromptSideOnly
from ...policy.kv_transfer import TransferMode, choose_mode
from ..messages import KvDone, KvDrop, KvLayer, KvStart, encode
from ..messages.kinds import KvMode
from .transports import KVTransport, Put, Target, TransportError

if TYPE_CHECKING:
    import torch

    from ...engine.kv_cache import KVExport


@dataclass(slots=True)
class Outbound:
    target: Target
    threshold: int
    skip: int = 0    # leading prompt positions the receiver holds already: not sent
    layerwise: bool = False
    sent_at: float = 0.0
    ok: bool = True  # every message went out
    error: str = ""  # a put failed: nothing more is put, the kvd says why


class KVSender(PromptSideOnly):
    """The prompt side of the worker's connector (see the module docstring). `on_done`, if given,
    gets each closed transfer's figures as the sender sees them: {"rid", "ok", "mode", "error"}.
    `layer_delay_s` (tests only) sleeps after each streamed layer: a slow prefill, to kill a peer
    mid-transfer."""

    def __init__(self, transport: KVTransport, layer_delay_s: float = 0.0,
                 on_done: Callable[[dict], None] | None = None) -> None:
        self.transport = transport
        self.layer_delay_s = layer_delay_s
        self.on_done = on_done
        self.plans: dict[str, Outbound] = {}
        self._streaming: dict[str, Outbound] = {}  # prompts finishing layer-wise in the running step

    def plan(self, rid: str, dest: int, dest_ident: str, address: str, threshold: int,
             where: dict | None = None, skip: int = 0) -> None:
        """The request's KV goes to worker `dest` (its identity, its KV endpoint); `where`: the
        token worker's "where to write" for a one-sided transport ({"region", "blocks"}); `skip`:
        the leading prompt positions it holds already (its prefix cache), not sent."""
        self.plans[rid] = Outbound(Target(dest, dest_ident, address, where, skip=skip), threshold, skip)

    def _put(self, plan: Outbound, layer: int | None, kv: torch.Tensor) -> Put | None:
        """Put `kv` for `plan`; None (and plan.error set) on failure."""
        try:
            return self.transport.put(plan.target, layer, kv)
        except TransportError as e:
            plan.error = str(e)
            return None

    # ---- the contract: worker role --------------------------------------------------------
    def start_step(self, prompts: list[PromptChunk]) -> Collection[str]:
        self._streaming = {}
        tokens = sum(p.num_tokens for p in prompts)
        for p in prompts:
            plan = self.plans.get(p.request_id)
            if plan is None:
                continue
            # "a step of your prompt starts": the token worker's clock restarts
            self.transport.send(plan.target, encode(KvStart(rid=p.request_id)))
            if not p.last:
                continue
            plan.layerwise = choose_mode(tokens, plan.threshold) is TransferMode.LAYERWISE
            if plan.layerwise:
                self._streaming[p.request_id] = plan
        return self._streaming.keys()

    def save_layer(self, layer: int, kv: Mapping[str, torch.Tensor]) -> None:
        for rid, t in kv.items():
            plan = self._streaming.get(rid)
            if plan is None or plan.error:
                continue
            if layer == 0:
                plan.sent_at = time.time()
            put = self._put(plan, layer, t[:, plan.skip:] if plan.skip else t)
            if put is not None:
                msg = KvLayer(rid=rid, layer=layer, sent_at=plan.sent_at, inplace_bytes=put.inplace_bytes)
                plan.ok &= self.transport.send(plan.target, encode(msg), *put.frames)
        if self.layer_delay_s:
            time.sleep(self.layer_delay_s)

    def end_step(self) -> None:
        self._streaming = {}

    # ---- the contract: scheduler role ------------------------------------------------------
    def request_finished(self, request_id: str, first_token: int, export: KVExport | None,
                         logprobs: list | None = None) -> None:
        plan = self.plans.pop(request_id, None)
        if plan is None:
            return
        end = time.time()
        mode: KvMode = "layerwise" if plan.layerwise else "serialized"
        put = None
        if not plan.layerwise and export is not None and not plan.error:
            plan.sent_at = end
            put = self._put(plan, None, export.data[:, :, plan.skip:] if plan.skip else export.data)
        if put is None or plan.error:
            put = Put()  # nothing goes with the kvd
        msg = KvDone(rid=request_id, first_token=first_token, prefill_end=end, mode=mode,
                     sent_at=plan.sent_at or end, meta=put.meta, inplace_bytes=put.inplace_bytes,
                     fail=plan.error or None, lp=logprobs)
        plan.ok &= self.transport.send(plan.target, encode(msg), *put.frames)
        if self.on_done is not None:
            self.on_done({"rid": request_id, "ok": plan.ok and not plan.error, "mode": mode, "error": plan.error})

    def request_dropped(self, request_id: str) -> None:
        """Drop a plan before its `kvd`. On a one-sided transport, tell the token worker that its
        blocks will not be written again."""
        plan = self.plans.pop(request_id, None)
        self._streaming.pop(request_id, None)
        if plan is not None and self.transport.one_sided:
            self.transport.send(plan.target, encode(KvDrop(rid=request_id)))
