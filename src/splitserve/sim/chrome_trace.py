"""A simulation as a Chrome trace (`simulate --trace-out FILE`): every batch of every machine and
every KV transfer as a complete event ("ph": "X") of the Trace Event Format, which Perfetto
(ui.perfetto.dev) and chrome://tracing open. Machines are threads of one process, named by id,
pool and hardware; transfers are threads of a second process, one per sending machine.

Bounded: after `max_events` events the rest are counted, not kept (`otherData.dropped_events`),
so a datacenter-scale run cannot fill the disk; the first part of the run is what is kept."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from ..policy.state import Machine

MACHINES, TRANSFERS = 1, 2  # the two processes of the trace
DEFAULT_MAX_EVENTS = 500_000


class ChromeTrace:
    def __init__(self, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        if max_events < 1:
            raise ValueError("max_events must be at least 1")
        self.max_events = max_events
        self.events: list[dict[str, object]] = []
        self.dropped = 0
        self.names: dict[tuple[int, int], str] = {}

    def name(self, pid: int, tid: int, name: str) -> None:
        """The label of one lane (a machine, or a machine's outgoing transfers)."""
        self.names[pid, tid] = name

    def name_machines(self, machines: Iterable[Machine]) -> None:
        """Label each machine's lanes: its id, home pool and hardware; its outgoing transfers."""
        for m in machines:
            self.name(MACHINES, m.id, f"m{m.id} {m.home.name.lower()} {m.hardware}")
            self.name(TRANSFERS, m.id, f"from m{m.id}")

    def _add(self, ev: dict[str, object]) -> None:
        if len(self.events) < self.max_events:
            self.events.append(ev)
        else:
            self.dropped += 1

    def batch(self, machine: int, start: float, dur: float, prompt_tokens: int, decodes: int,
              context: int, preempted: int) -> None:
        """One iteration of `machine` from `start` for `dur` seconds: prompt, decode or mixed."""
        kind = "mixed" if prompt_tokens and decodes else "prompt" if prompt_tokens else "decode"
        self._add({"name": kind, "cat": "batch", "ph": "X", "pid": MACHINES, "tid": machine,
                   "ts": start * 1e6, "dur": dur * 1e6,
                   "args": {"prompt_tokens": prompt_tokens, "decodes": decodes, "kv_tokens": context,
                            "preempted": preempted}})

    def transfer(self, src: int, dst: int, request: int, start: float, end: float, nbytes: int,
                 layerwise: bool) -> None:
        """Request `request`'s KV from machine `src` to `dst`, `start` (its prompt's batch began,
        layer-wise; else when it could go) to `end` (landed)."""
        self._add({"name": f"KV {request} -> m{dst}", "cat": "transfer", "ph": "X", "pid": TRANSFERS, "tid": src,
                   "ts": start * 1e6, "dur": max(0.0, end - start) * 1e6,
                   "args": {"request": request, "to": dst, "bytes": nbytes,
                            "mode": "layerwise" if layerwise else "serialized"}})

    def write(self, path: str | Path) -> Path:
        meta = [{"name": "process_name", "ph": "M", "pid": MACHINES, "args": {"name": "machines"}},
                {"name": "process_name", "ph": "M", "pid": TRANSFERS, "args": {"name": "KV transfers"}}]
        meta += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
                 for (pid, tid), name in sorted(self.names.items())]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:
            json.dump({"traceEvents": meta + self.events, "displayTimeUnit": "ms",
                       "otherData": {"events": len(self.events), "dropped_events": self.dropped,
                                     "max_events": self.max_events}}, f, separators=(",", ":"))
        return path
