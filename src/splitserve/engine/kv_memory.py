"""The reference KV connector: both sides of the contract (kv_connector.py) for engines in one
process, tensors moved directly. Tests use it; serve/kv/ implements the same contract over
ZeroMQ (tcp) and shared memory (local)."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import torch

from ..policy.kv_transfer import DEFAULT_LAYERWISE_THRESHOLD, TransferMode, choose_mode
from .kv_cache import KVExport
from .kv_connector import KVConnector, KVFinished, PromptChunk


@dataclass(frozen=True, slots=True)
class InMemoryWhere:
    """InMemoryConnector's "where to write": the receiving connector (and the request)."""

    dest: InMemoryConnector
    request_id: str


@dataclass(slots=True)
class _Incoming:
    num_tokens: int
    deadline: float
    got: set[int] = field(default_factory=set)


class InMemoryConnector(KVConnector):
    """Both sides of the contract for engines in one process (tests, examples):

        b_conn, a_conn = InMemoryConnector(), InMemoryConnector(threshold=0)
        A, B = LLMEngine("tiny", connector=a_conn), LLMEngine("tiny", connector=b_conn)
        where = b_conn.reserve("r", prompt, params)        # B holds room for it
        a_conn.send_to("r", where)                         # A's prefill of "r" goes there
        A.add_request(prompt, params, "r", prefill_only=True)
        while A.has_unfinished(): A.step()                 # the KV moves as A computes it
        while B.has_unfinished(): B.step()                 # B decodes from A's first token

    Layer-wise when a step's prompt tokens reach `threshold` (the policy's choose_mode), else the
    whole KV after the step. A reservation not complete within `timeout_s` (None: never) fails.
    `events`: ("kv_in", rid, mode) or ("kv_fail", rid, reason), in order; `stray` counts K/V for
    no live reservation."""

    def __init__(self, threshold: int = DEFAULT_LAYERWISE_THRESHOLD, timeout_s: float | None = None) -> None:
        self.threshold, self.timeout_s = threshold, timeout_s
        self.plans: dict[str, InMemoryWhere] = {}    # prompt side: rid -> where its KV goes
        self.streaming: set[str] = set()             # ... streamed in the running step
        self.modes: dict[str, str] = {}              # token side: the mode of each loaded request
        self.incoming: dict[str, _Incoming] = {}     # ... reservations waiting for their KV
        self.events: list[tuple] = []
        self.stray = 0
        self._finished = KVFinished()

    # ---- routing: called by whoever pairs the engines ----------------------------------------
    def reserve(self, request_id: str, prompt_ids: list[int], params=None, isolated: bool = False) -> InMemoryWhere:
        """Token side: reserve room for the request's KV now (UserError if it does not fit)."""
        self.bound().reserve_kv(prompt_ids, params, request_id, isolated)
        deadline = time.monotonic() + self.timeout_s if self.timeout_s is not None else float("inf")
        self.incoming[request_id] = _Incoming(len(prompt_ids), deadline)
        return InMemoryWhere(self, request_id)

    def release(self, request_id: str) -> bool:
        """Token side: the request was dropped (the router's abort): free its reservation."""
        if self.incoming.pop(request_id, None) is None:
            return False
        self._finished.freed.append(request_id)
        return True

    def send_to(self, request_id: str, where: InMemoryWhere) -> None:
        """Prompt side: the request's KV goes to `where` (before its prefill starts)."""
        self.plans[request_id] = where

    # ---- the peer's calls (token side) --------------------------------------------------------
    def _put(self, rid: str, layer: int, kv: torch.Tensor) -> None:
        inc = self.incoming.get(rid)
        if inc is None:
            self.stray += 1
            return
        host = self.bound()
        skip = host.kv_cached(rid)  # positions its prefix cache holds: not written again
        host.write_kv_layer(rid, layer, kv[:, skip:], skip)
        inc.got.add(layer)

    def _done(self, rid: str, first_token: int, mode: str) -> None:
        inc = self.incoming.pop(rid, None)
        if inc is None:
            self.stray += 1
            return
        layers = self.bound().kv_layout.num_layers
        if len(inc.got) != layers:
            self._finished.freed.append(rid)
            self.events.append(("kv_fail", rid, f"{len(inc.got)} of {layers} layers arrived"))
            return
        self.modes[rid] = mode
        self._finished.loaded.append((rid, first_token))

    # ---- the contract -------------------------------------------------------------------------
    def start_step(self, prompts: list[PromptChunk]) -> Collection[str]:
        tokens = sum(p.num_tokens for p in prompts)
        layerwise = choose_mode(tokens, self.threshold) is TransferMode.LAYERWISE
        self.streaming = {p.request_id for p in prompts if p.last and layerwise and p.request_id in self.plans}
        return self.streaming

    def save_layer(self, layer: int, kv: Mapping[str, torch.Tensor]) -> None:
        for rid, t in kv.items():
            where = self.plans[rid]
            where.dest._put(where.request_id, layer, t)

    def end_step(self) -> None:
        self.streaming = set()

    def request_finished(self, request_id: str, first_token: int, export: KVExport | None,
                         logprobs: list | None = None) -> None:
        where = self.plans.pop(request_id, None)
        if where is None:
            return
        streamed = request_id in self.streaming
        if not streamed and export is not None:
            for i in range(export.num_layers):
                where.dest._put(where.request_id, i, export.layer(i))
        where.dest._done(where.request_id, first_token, "layerwise" if streamed else "serialized")

    def request_dropped(self, request_id: str) -> None:
        where = self.plans.pop(request_id, None)
        self.streaming.discard(request_id)
        if where is not None:
            where.dest.release(where.request_id)

    def get_finished(self) -> KVFinished:
        now = time.monotonic()
        for rid in [r for r, inc in self.incoming.items() if inc.deadline < now]:
            del self.incoming[rid]
            self._finished.freed.append(rid)
            self.events.append(("kv_fail", rid, f"timed out after {self.timeout_s:g} s"))
        out, self._finished = self._finished, KVFinished()
        return out

    def load_started(self, request_id: str, error: str | None) -> None:
        mode = self.modes.pop(request_id, None)
        self.events.append(("kv_in", request_id, mode) if error is None else ("kv_fail", request_id, error))
