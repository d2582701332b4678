"""Simulator speed of two source trees side by side: the hour runs of sim_speed.py, alternating
the old tree and the new one, each run in its own process pinned to one core (sim_speed.py
--one). Used to check that a refactor kept the simulator's speed (issue 25: events/s within 3%).

    python benchmarks/sim_speed_ab.py --old /path/to/old/checkout [--cases coding-1h,conversation-1h]
        [--pairs 3] [--out benchmarks/results/sim_speed_ab.json]

The old checkout runs its own benchmarks/sim_speed.py with PYTHONPATH at its src/; the new one is
this checkout's. Reported: events/s of every run, the medians, and new/old of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from sim_speed import machine_info

ROOT = Path(__file__).resolve().parents[1]


def one(checkout: Path, case: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout / "src"), "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = ["taskset", "-c", "0", sys.executable, str(checkout / "benchmarks" / "sim_speed.py"), "--one", case]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the other checkout (its src/ and benchmarks/sim_speed.py)")
    ap.add_argument("--cases", default="coding-1h,conversation-1h")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sim_speed_ab.json"))
    args = ap.parse_args()
    trees = {"old": Path(args.old).resolve(), "new": ROOT}
    results = []
    for case in args.cases.split(","):
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        for i in range(args.pairs):
            for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
                r = one(trees[side], case)
                runs[side].append(r)
                print(f"{case:16s} {side}  {r['events']:>10,} events  {r['events_per_s']:>8,} events/s  "
                      f"peak RSS {r['peak_rss_mb']} MB", flush=True)
        same = {(r["events"], r["requests"], r["ttft_p50_s"], r["tbt_p50_s"]) for s in runs.values() for r in s}
        med = {s: statistics.median(r["events_per_s"] for r in runs[s]) for s in runs}
        results.append({"case": case, "events_per_s": {s: [r["events_per_s"] for r in runs[s]] for s in runs},
                        "median_events_per_s": med, "new_over_old": round(med["new"] / med["old"], 4),
                        "peak_rss_mb": {s: max(r["peak_rss_mb"] for r in runs[s]) for s in runs},
                        "same_events_and_latencies": len(same) == 1})
        print(f"{case:16s} new/old {med['new'] / med['old']:.3f}", flush=True)
    Path(args.out).write_text(json.dumps({"machine": machine_info(), "old": str(trees["old"]),
                                          "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
