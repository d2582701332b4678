"""The live workers' engine steps of recorded twin runs against the model's, at each run's own
host speed, by what ran beside each step: alone, beside a prompt step (one that computed tokens,
none from a prefix cache), beside a cached prompt step (as many tokens from the cache as computed,
or more), beside a decode step (the other worker's step that overlapped it most), or partly
beside (10-90% of it). The step tables of issue 42 item 1.

    python benchmarks/twin/beside.py benchmarks/twin/recorded/<set>/<run> ...
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path

from splitserve.twin.calibrate import between
from splitserve.twin.machine import load_machine_profile
from splitserve.twin.run import loaded, planned, spec_from_dict
from splitserve.twin.steps import ALONE, SHARED, busy_fraction, busy_spans, modelled, read_steps, run_speed


def cached_share(run: Path) -> dict[tuple[int, float], tuple[int, int]]:
    """(worker, start) -> (prompt tokens computed, prompt tokens before them: cached) of each step."""
    out = {}
    for f in sorted((run / "steps").glob("worker-*.jsonl*")):
        w = int(f.name.split(".", 1)[0].split("-", 1)[1])
        text = gzip.decompress(f.read_bytes()).decode() if f.suffix == ".gz" else f.read_text()
        for line in text.splitlines():
            j = json.loads(line)
            pre = [(b, n) for b, n in j["seqs"] if n > 1 or b == 0]
            out[w, j["t"]] = (sum(n for _, n in pre), sum(b for b, _ in pre))
    return out


def table(run: Path) -> dict[tuple[str, str], list[float]]:
    """(kind of step, what ran beside) -> [steps, live seconds, model seconds]."""
    machine = load_machine_profile(run.parent / "profile")
    rec = json.loads((run / "record.json").read_text())
    spec = spec_from_dict(rec["spec"])
    steps, reqs = between(read_steps(run / "steps"), rec["live"].get("calibration", {})), planned(spec)
    under = loaded(spec, run_speed(steps, machine, loaded(spec, machine, reqs)), reqs)
    share = cached_share(run)
    acc: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for s, spans in zip(steps, busy_spans(steps, under.timing.cores_of)):
        f = busy_fraction(s, spans)
        cond = "alone" if f < ALONE else "partly" if f <= SHARED else "beside " + beside_kind(s, steps, share)
        kind = "mixed" if s.prompt_tokens and s.decodes else "prompt" if s.prompt_tokens else "decode"
        a = acc[kind, cond]
        a[0] += 1
        a[1] += s.seconds
        a[2] += modelled(s, under, spans)
    return acc


def beside_kind(s, steps, share) -> str:
    """The kind of the other worker's step that overlapped `s` most."""
    best, kind = 0.0, "decode"
    for o in steps:
        if o.worker == s.worker:
            continue
        both = min(s.start + s.seconds, o.start + o.seconds) - max(s.start, o.start)
        if both > best:
            new, cached = share[o.worker, o.start]
            best, kind = both, "decode" if new == 0 else "cached prompt" if cached >= new else "prompt"
    return kind


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+")
    for run in ap.parse_args().runs:
        print(f"{run.parent.name}/{run.name}\n| steps | beside | count | live s | model s | error |\n|---|---|---:|---:|---:|---:|")
        for (kind, cond), (n, live, model) in sorted(table(run).items()):
            print(f"| {kind} | {cond} | {n} | {live:.2f} | {model:.2f} | {model / live - 1:+.1%} |")


if __name__ == "__main__":
    main()
