"""The live workers' engine steps against the simulator's step model: which term misses, and by
how much. `serve --step-log DIR` has each worker append a line per step it ran (start, seconds,
each sequence's KV tokens before the step and tokens run, and the prompts whose KV it sent); here
every such step gets the time the simulator gives a step of that shape on the measured machine
(machine.py: the perf model over the KV the engine reads, the KV the step sends, the co-run
slowdown while another worker of the host computes, the step overhead), and the two are summed
per kind of step and per condition (alone: no other worker computed during the step; shared:
another computed through all of it)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import statistics
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .corun import BESIDE_DECODE, BESIDE_PROMPT, Beside
from .machine import MachineProfile

ALONE, SHARED = 0.1, 0.9  # a step is alone below this fraction of overlap, shared above the other
WARMUP_S = 0.5  # a worker's steps this long after its first are its warm-up (lone_steps)


@dataclass(frozen=True, slots=True)
class Step:
    worker: int
    start: float
    seconds: float
    prompt_tokens: int   # prefill chunks' tokens
    prompt_sq: int       # the sum of each chunk's tokens squared (the attention term)
    decodes: int
    context: int         # the decodes' KV tokens
    longest: int = 0     # the longest decode's KV tokens
    sent: tuple[int, ...] = ()  # prompt tokens of each prompt whose KV the step handed over
    cpu: float = 0.0     # the worker's CPU seconds in the step (0: a log that did not record them)

    @property
    def kind(self) -> str:
        if self.prompt_tokens and self.decodes:
            return "mixed"
        if self.decodes:
            return "decode"
        return "prompt <= 512" if self.prompt_tokens <= 512 else "prompt > 512"


def step_of(worker: int, line: dict) -> Step:
    """A step log line as a Step: a sequence running more than one token, or its first, is a
    prefill chunk; the others decode one token over their KV (tokens before + the one run)."""
    p = sq = d = ctx = longest = 0
    for before, n in line["seqs"]:
        if n > 1 or before == 0:
            p += n
            sq += n * n
        else:
            d += 1
            ctx += before + n
            longest = max(longest, before + n)
    return Step(worker, line["t"], line["s"], p, sq, d, ctx, longest, tuple(line.get("sent", ())),
                float(line.get("cpu", 0.0)))


def read_steps(log_dir: str | Path) -> list[Step]:
    """Every step in log_dir/worker-<id>.jsonl (or .jsonl.gz, as a recorded run keeps them), by start time."""
    steps = []
    for f in sorted(Path(log_dir).glob("worker-*.jsonl*")):
        w = int(f.name.split(".", 1)[0].split("-", 1)[1])
        text = gzip.decompress(f.read_bytes()).decode() if f.suffix == ".gz" else f.read_text()
        steps += [step_of(w, json.loads(line)) for line in text.splitlines() if line.strip()]
    return sorted(steps, key=lambda s: s.start)


def overlaps(steps: list[Step]) -> list[float]:
    """For each step, the fraction of it during which a step of another worker ran."""
    return [busy_fraction(s, spans) for s, spans in zip(steps, busy_spans(steps))]


def busy_fraction(s: Step, spans: list[tuple[int, int, float, Beside]]) -> float:
    """The fraction of step `s` during which another worker computed (its busy_spans)."""
    return min(1.0, sum(t for n, _, t, _ in spans if n) / s.seconds) if s.seconds > 0 else 0.0


def busy_spans(steps: list[Step], cores=None) -> list[list[tuple[int, int, float, Beside]]]:
    """For each step, its time cut where other workers' steps start or end: (other workers
    computing, of them those sharing a core with its worker by `cores(worker)`, seconds, the steps
    they run: (kind, size) each, as WorkerTiming.slowdown takes them)."""
    by_worker: dict[int, list[Step]] = {}
    for s in steps:
        by_worker.setdefault(s.worker, []).append(s)
    starts = {w: [o.start for o in ws] for w, ws in by_worker.items()}
    out = []
    for s in steps:
        end = s.start + s.seconds
        edges = {s.start, end}
        ivs = []
        for w, others in by_worker.items():
            if w == s.worker:
                continue
            same = cores is not None and not cores(w).isdisjoint(cores(s.worker))
            # a worker's steps follow one another: only the one running at s.start and later
            # ones can overlap s
            for o in others[max(0, bisect_right(starts[w], s.start) - 1):]:
                if o.start >= end:
                    break
                a, b = max(s.start, o.start), min(end, o.start + o.seconds)
                if b > a:
                    ivs.append((a, b, same, (BESIDE_PROMPT, o.prompt_tokens) if o.prompt_tokens
                                else (BESIDE_DECODE, o.decodes)))
                    edges.update((a, b))
        cuts = sorted(edges)
        spans = []
        for a, b in zip(cuts, cuts[1:]):
            mid = (a + b) / 2
            on = [(same, kind) for lo, hi, same, kind in ivs if lo <= mid < hi]
            spans.append((len(on), sum(same for same, _ in on), b - a, tuple(kind for _, kind in on)))
        out.append(spans)
    return out


@dataclass(frozen=True, slots=True)
class StepRow:
    kind: str
    condition: str   # alone, shared, partly
    steps: int
    live_s: float    # the live steps' seconds, summed
    model_s: float   # the model's seconds for the same steps, summed

    @property
    def error(self) -> float:
        """(model - live) / live, as the latency table's errors."""
        return (self.model_s - self.live_s) / self.live_s if self.live_s > 0 else 0.0


def modelled(s: Step, machine: MachineProfile, spans: list[tuple[int, int, float, Beside]]) -> float:
    """The simulator's time for step `s` with the other workers busy as they were live (`spans`,
    busy_spans), running the kinds of step they ran: its work at the time-weighted mean of the
    host's slowdown over the step."""
    timing = machine.timing
    kv = timing.decode_kv(s.longest, s.decodes) if s.decodes else 0
    alone = machine.perf.mixed_time(s.prompt_tokens, s.decodes, kv, s.prompt_sq if machine.perf.attention else 0)
    work = timing.work_s(alone, s.prompt_tokens > 0, sum(machine.send_s(n) for n in s.sent))
    total = sum(t for _, _, t, _ in spans)
    if total <= 0:
        return work * timing.slowdown(s.prompt_tokens > 0, 0)
    if not machine.pinned:  # where the OS placed each worker is not logged: the cores shared evenly
        return work * sum(timing.slowdown(s.prompt_tokens > 0, n, beside=k) * t for n, c, t, k in spans) / total
    cores = timing.host_cores
    return work * sum(timing.slowdown(s.prompt_tokens > 0, n, 1 + c, max(0, cores - 1 - (n - c)), k) * t
                      for n, c, t, k in spans) / total


def compare_steps(steps: list[Step], machine: MachineProfile) -> list[StepRow]:
    """Live vs modelled step seconds per kind and condition, then per kind, then all steps."""
    acc: dict[tuple[str, str], list[float]] = {}
    for s, spans in zip(steps, busy_spans(steps, machine.timing.cores_of)):
        f = busy_fraction(s, spans)
        cond = "alone" if f < ALONE else "shared" if f > SHARED else "partly"
        m = modelled(s, machine, spans)
        for key in ((s.kind, cond), (s.kind, "all"), ("all", "all")):
            a = acc.setdefault(key, [0, 0.0, 0.0])
            a[0] += 1
            a[1] += s.seconds
            a[2] += m
    order = ["prompt <= 512", "prompt > 512", "decode", "mixed", "all"]
    conds = ["alone", "partly", "shared", "all"]
    keys = sorted(acc, key=lambda k: (order.index(k[0]), conds.index(k[1])))
    return [StepRow(k, c, int(acc[k, c][0]), acc[k, c][1], acc[k, c][2]) for k, c in keys]


def lone_steps(steps: list[Step], machine: MachineProfile) -> Iterator[tuple[Step, list[tuple[int, int, float, Beside]]]]:
    """(step, its busy_spans) of the steps no other worker computed beside (overlap < ALONE), but
    those of each worker's first WARMUP_S: a fresh worker's warm-up is a one-off, not the host's
    speed."""
    first: dict[int, float] = {}
    for s, spans in zip(steps, busy_spans(steps, machine.timing.cores_of)):
        if s.start - first.setdefault(s.worker, s.start) >= WARMUP_S and busy_fraction(s, spans) < ALONE:
            yield s, spans


def slowest_step(steps: list[Step], least: int = 5) -> tuple[float, float] | None:
    """(its CPU seconds over the median of its worker's steps of the same shape, seconds after the
    run's first step) of the step that burnt the most CPU against its shape, among shapes run at
    least `least` times after each worker's warm-up (WARMUP_S): a host stall, which no model of the
    host's speed foresees. None: no such shape, or a log without CPU seconds."""
    first: dict[int, float] = {}
    shapes: dict[tuple[int, int, int], list[Step]] = {}
    for s in steps:
        if s.cpu > 0 and s.start - first.setdefault(s.worker, s.start) >= WARMUP_S:
            shapes.setdefault((s.worker, s.prompt_tokens, s.decodes), []).append(s)
    worst: tuple[float, float] | None = None
    for group in shapes.values():
        if len(group) >= least:
            median = statistics.median(s.cpu for s in group)
            top = max(group, key=lambda s: s.cpu)
            if worst is None or top.cpu / median > worst[0]:
                worst = (top.cpu / median, top.start - steps[0].start)
    return worst


def drift(steps: list[Step], machine: MachineProfile, alone_only: bool = False) -> tuple[float, float]:
    """(prompt, decode): the live steps' seconds over the model's for the same steps, steps with
    prompt tokens and the rest: how much slower (> 1) the host ran than `machine` assumed (its
    drift; MachineProfile.drift takes their product). `alone_only`: only the steps no other worker
    computed beside (lone_steps), so that the co-run and time-sharing terms stay the model's to
    predict; a kind with no such step keeps 1.0."""
    sums = [[0.0, 0.0], [0.0, 0.0]]
    for s, spans in lone_steps(steps, machine) if alone_only else zip(steps, busy_spans(steps, machine.timing.cores_of)):
        a = sums[0 if s.prompt_tokens else 1]
        a[0] += s.seconds
        a[1] += modelled(s, machine, spans)
    prompt, decode = (live / model if model > 0 else 1.0 for live, model in sums)
    return prompt, decode


def run_speed(steps: list[Step], machine: MachineProfile, under: MachineProfile,
              spread: bool = False) -> MachineProfile:
    """`machine` at the host's speed during a live run: its drift times that of the run's lone
    steps against `under` (`machine` as the run loaded it, run.loaded); with `spread`, each
    simulated step's work also drawn from the lone steps' own live / model (lone_spread)."""
    lone = drift(steps, under, alone_only=True)
    out = dataclasses.replace(machine, drift=(machine.drift[0] * lone[0], machine.drift[1] * lone[1]))
    return dataclasses.replace(out, spread=lone_spread(steps, under, lone)) if spread else out


def lone_spread(steps: list[Step], under: MachineProfile, lone: tuple[float, float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(prompt, decode): each lone step's live seconds over the model's, over the kind's drift
    `lone` (so that they average 1): how the host's steps spread about its speed."""
    out: tuple[list[float], list[float]] = ([], [])
    for s, spans in lone_steps(steps, under):
        k = 0 if s.prompt_tokens else 1
        model = modelled(s, under, spans)
        if model > 0:
            out[k].append(s.seconds / model / lone[k])
    return tuple(out[0]), tuple(out[1])


def steps_markdown(rows: list[StepRow]) -> str:
    lines = ["| steps | when | count | live s | model s | error |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.kind} | {r.condition} | {r.steps} | {r.live_s:.2f} | {r.model_s:.2f} | {r.error:+.1%} |")
    return "\n".join(lines)
