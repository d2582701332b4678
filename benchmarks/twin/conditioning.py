"""How well a run measures its own percentiles: each P50 / P90 of TTFT, TBT and E2E resampled over
the run's requests (a bootstrap: the requests drawn again with replacement, 400 times, a seeded
generator), its standard deviation over its median. A bound of 15% on a percentile whose own
resampling moves it by 12-17% tests the draw of requests, not the model (benchmarks/twin/README.md,
"The baseline's P50s measured a mixing fraction").

    python benchmarks/twin/conditioning.py live DIR [DIR ...]      # saved runs (requests.jsonl below DIR)
    python benchmarks/twin/conditioning.py load --loads 0.35,0.5,0.65 PROFILE [PROFILE ...]

`live` reads every requests.jsonl under each DIR (bounds.py's run folders, or the CI test's
bounds0..4), grouped by design, workload and prompt cap; `load` simulates the runs of
twin/bounds.py at each share of the predicted capacity on each profile (no live run) and
resamples the simulated requests.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from splitserve.twin.bounds import LOAD, RUNS, spec_of
from splitserve.twin.machine import load_machine_profile
from splitserve.twin.run import simulate

DRAWS = 400
CELLS = [(k, p) for k in ("ttft", "tbt", "e2e") for p in (50, 90)]


def spread(requests: list[tuple[float, float, int]], rng: np.random.Generator) -> dict[tuple[str, int], float]:
    """(ttft, e2e, tokens) of each request -> {(metric, percentile): resampled std / median}; TBT
    is each request's mean gap, once per gap (as twin/report.samples_from_requests_jsonl)."""
    ttft, e2e, tokens = (np.array(c, dtype=float) for c in zip(*requests))
    gaps = np.where(tokens > 1, (e2e - ttft) / np.maximum(tokens - 1, 1), 0.0)
    weights = np.maximum(tokens - 1, 0).astype(int)
    draws = defaultdict(list)
    for _ in range(DRAWS):
        i = rng.integers(0, len(ttft), len(ttft))
        for (k, p) in CELLS:
            v = {"ttft": ttft[i], "e2e": e2e[i], "tbt": np.repeat(gaps[i], weights[i])}[k]
            draws[(k, p)].append(np.percentile(v, p))
    return {c: float(np.std(d) / np.median(d)) for c, d in draws.items()}


def live_runs(root: Path):
    for f in sorted(root.rglob("requests.jsonl")):
        s = json.loads((f.parent / "summary.json").read_text())
        served = re.search(r"(\d+) workers up .*design (\w+)", (f.parent / "serve.log").read_text())
        design = f"{served[2]}, {served[1]} workers" if served else "?"
        label = f"{s['workload']['name']}, {design}, prompts <= {s['bench']['max_prompt_tokens']}"
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        yield label, [(r["ttft"], r["e2e"], r["tokens"]) for r in rows if r["outcome"] == "completed"]


def live_spread(dirs: list[Path], rng: np.random.Generator) -> dict[str, list[dict]]:
    """Each saved live run's spread, by its label."""
    got: dict[str, list[dict]] = defaultdict(list)
    for d in dirs:
        for label, reqs in live_runs(d):
            got[label].append(spread(reqs, rng))
    return got


def simulated_spread(profiles: list[Path], loads: list[float], runs: str,
                     rng: np.random.Generator) -> dict[str, list[dict]]:
    """The spread of each run of twin/bounds.py whose name holds `runs`, simulated at each load
    (a share of the capacity the profile predicts) on each profile."""
    got: dict[str, list[dict]] = defaultdict(list)
    for prof in profiles:
        machine = load_machine_profile(prof)
        for name in [n for n in RUNS if runs in n]:
            spec = spec_of(name, machine)
            for load in loads:
                result, _, under = simulate(dataclasses.replace(spec, rps=spec.rps / LOAD[spec.design] * load), machine)
                over = under.request_overhead
                reqs = [(r.token_times[0] - r.arrival + over, r.token_times[-1] - r.arrival + over,
                         len(r.token_times)) for r in result.requests if r.token_times]
                got[f"{name}, load {load:.2f}"].append(spread(reqs, rng))
    return got


def print_table(title: str, got: dict[str, list[dict]]) -> None:
    print(f"{title:44s} n  " + " ".join(f"{k.upper()} P{p}".rjust(9) for k, p in CELLS))
    for label, runs in got.items():
        print(f"{label:44s} {len(runs):2d} " + " ".join(
            f"{np.median([r[c] for r in runs]):9.1%}" for c in CELLS) + "   (median over runs)")
        print(f"{'':44s}    " + " ".join(f"{max(r[c] for r in runs):9.1%}" for c in CELLS) + "   (largest)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    lv = sub.add_parser("live", help="resample saved live runs")
    lv.add_argument("dirs", type=Path, nargs="+")
    ld = sub.add_parser("load", help="resample simulated runs by load")
    ld.add_argument("profiles", type=Path, nargs="+")
    ld.add_argument("--loads", default="0.35,0.5,0.65")
    ld.add_argument("--runs", default="baseline", help="only the runs of twin/bounds.py whose name holds this")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    if a.what == "live":
        print_table("live run (requests resampled)", live_spread(a.dirs, rng))
    else:
        loads = [float(x) for x in a.loads.split(",")]
        print_table("simulated run (requests resampled)", simulated_spread(a.profiles, loads, a.runs, rng))


if __name__ == "__main__":
    main()
