"""The simulator's KV hand-over (paper §IV-C): a prefilled request's KV goes from its prompt
machine to its token machine over the link between their kinds, serialized behind the prompt
machine's earlier transfers or layer by layer under the batch that made it (sim/kv_transfer.py);
when it lands the prompt machine's copy is freed, and freed memory admits the requests waiting
for it (policy/cluster.py admit_freed). A part of `Simulation` (sim/simulator.py)."""

from __future__ import annotations

from mypy_extensions import trait

from ..policy.cluster import ClusterScheduler, admit_freed, pull_kv, readmit
from ..policy.preemption import sent_back
from ..policy.prefix_cache import cached_tokens
from ..policy.state import Machine, Phase, Request
from ..policy.transitions import kv_landed
from .chrome_trace import ChromeTrace
from .events import TRANSFER_END
from .hosts import Hosts
from .kv_transfer import Link, layerwise_done, serialized_done
from .metrics import Metrics


@trait
class KVHandoff:
    """Simulation's hand-over of KV between machines (its state is the simulation's)."""
    links: dict[tuple[str, str], Link]
    hosts: Hosts
    machines: list[Machine]
    kv_bytes: int
    metrics: Metrics
    layers: int
    links_out: list[float]
    trace: ChromeTrace | None
    cls: ClusterScheduler
    block: int
    pull: bool

    def _push(self, t: float, kind: int, obj: object) -> None: ...

    def _start(self, m: Machine, now: float) -> None: ...

    def _prefix_named(self, m: Machine, r: Request) -> None: ...

    def _queued(self, r: Request, now: float) -> None: ...

    def _link(self, src: Machine, dst: Machine) -> Link:
        key = (src.hardware, dst.hardware)
        link = self.links.get(key)
        if link is None:
            link = self.links[key] = self.hosts.kv_link(src.hardware, dst.hardware)
        return link

    def _transfer_skip(self, t: Machine, r: Request) -> int:
        """Prompt tokens of `r` that token machine `t`'s prefix cache holds (sim/prefix.py), as its
        reservation finds them: not sent."""
        if r.blocks is None or t.cache is None:
            return 0
        skip = cached_tokens(t.cache, r.blocks, r.prompt_tokens, self.block)
        self.metrics.transfer_skipped += skip
        return skip

    def _handoff(self, p: Machine, r: Request, start: float, end: float, layerwise: bool) -> None:
        """Prefill of `r` done on prompt machine `p`: send its KV to its token machine (with pull,
        once that one has memory for it: policy/cluster.py pull_kv; else _freed sends it later)."""
        t = self.machines[r.token_machine]
        if not r.kv_on_token_machine and not pull_kv(t, r):
            return
        link = self._link(p, t)
        nbytes = (r.prefill_len - 1 - self._transfer_skip(t, r)) * self.kv_bytes  # a recompute's outputs too
        mt = self.metrics
        if layerwise:
            ready = start
            done = layerwise_done(link, nbytes, self.layers, start, end)
            mt.transfer_layerwise += 1
        else:
            ready = max(end, self.links_out[p.id])
            done = serialized_done(link, nbytes, ready)
            self.links_out[p.id] = done
        if self.trace is not None:
            self.trace.transfer(p.id, t.id, r.id, ready, done, nbytes, layerwise)
        mt.transfers += 1
        mt.transfer_bytes += nbytes
        mt.transfer_visible.add(done - end)
        self._push(done, TRANSFER_END, r)

    def _transfer_end(self, r: Request, now: float) -> None:
        p = self.machines[r.prompt_machine]
        t = self.machines[r.token_machine]
        kv_landed(p, t, r)
        if t.cache is not None:
            self._prefix_named(t, r)
        if not t.busy:
            self._start(t, now)
        self._freed(p, now)

    def _readmit(self, m: Machine, preempted: list[Request], now: float) -> None:
        """Decodes `m` preempted that recompute through the prompt pool (policy/preemption.py
        requeue): admitted again as at their arrival (policy/cluster.py readmit)."""
        for r in sent_back(m, preempted):
            if readmit(self.cls, r, self.pull):
                self._queued(r, now)

    def _freed(self, m: Machine, now: float) -> None:
        """KV memory was released on `m`: requests waiting for it may go, and `m` may resume."""
        if m.admit_queue:
            for r in admit_freed(self.cls, m):
                p = self.machines[r.prompt_machine]
                if r.phase is Phase.HANDOFF:  # pulled: its KV leaves its prompt machine now
                    self._handoff(p, r, now, now, False)
                elif not p.busy:
                    self._start(p, now)
        if not m.busy:
            self._start(m, now)
