"""Simulator speed of two source trees side by side: the hour runs of sim_speed.py, alternating
the old tree and the new one, each run in its own process pinned to one core (sim_speed.py
--one). Used to check that a refactor kept the simulator's speed (issue 25: events/s within 3%)
and to measure a speed-up (issue 29).

    python benchmarks/sim_speed_ab.py --old /path/to/old/checkout [--cases coding-1h,conversation-1h]
        [--pairs 3] [--new-python /path/to/venv/bin/python] [--old-python /path/to/old/venv/bin/python]
        [--new-args "--kv-allocation on-demand"] [--old-args ...] [--out benchmarks/results/sim_speed_ab.json]

Both sides run this checkout's benchmarks/sim_speed.py: the old one with PYTHONPATH at its src/,
the new one with PYTHONPATH at this checkout's src/ (pure Python), or, given --new-python, with
that interpreter's installed splitserve (e.g. a `pip install .` of this checkout, whose hot path
is compiled); --old-python does the same for the old side (a `pip install` of the old checkout).
--new-args / --old-args are options of sim_speed.py given to one side only (issue 41: the new
tree on demand against the old one, which reserves). Reported: wall and events/s of every run, the
medians, new/old of the medians; the same per CPU second of the run (what a busy host's waits
leave out).
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


def one(checkout: Path | None, case: str, python: str = sys.executable, args: list[str] | None = None) -> dict:
    """One run of `case` by `checkout`'s sources (None: `python`'s installed splitserve), with
    sim_speed.py's options `args`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout / "src")
    cmd = ["taskset", "-c", "0", python, str(ROOT / "benchmarks" / "sim_speed.py"), "--one", case, *(args or [])]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the other checkout (its src/ and benchmarks/sim_speed.py)")
    ap.add_argument("--cases", default="coding-1h,conversation-1h")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--new-python", help="run the new side with this interpreter's installed splitserve")
    ap.add_argument("--old-python", help="run the old side with this interpreter's installed splitserve")
    ap.add_argument("--new-args", default="", help="sim_speed.py options for the new side only, e.g. "
                                                   "'--kv-allocation on-demand'")
    ap.add_argument("--old-args", default="", help="sim_speed.py options for the old side only")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sim_speed_ab.json"))
    args = ap.parse_args()
    trees = {"old": None if args.old_python else Path(args.old).resolve(), "new": None if args.new_python else ROOT}
    pythons = {"old": args.old_python or sys.executable, "new": args.new_python or sys.executable}
    extra = {"old": args.old_args.split(), "new": args.new_args.split()}
    results = []
    load0 = os.getloadavg()
    for case in args.cases.split(","):
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        for i in range(args.pairs):
            for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
                r = one(trees[side], case, pythons[side], extra[side])
                runs[side].append(r)
                print(f"{case:16s} {side}  {r['events']:>10,} events  {r['sim_wall_s']:7.2f} s  "
                      f"{r['events_per_s']:>8,} events/s  {r['events_per_cpu_s']:>8,} events/CPU s  "
                      f"peak RSS {r['peak_rss_mb']} MB  {r['hot_path']}", flush=True)
        same = {(r["events"], r["requests"], r["ttft_p50_s"], r["tbt_p50_s"]) for s in runs.values() for r in s}
        med = {s: statistics.median(r["events_per_s"] for r in runs[s]) for s in runs}
        med_cpu = {s: statistics.median(r["events_per_cpu_s"] for r in runs[s]) for s in runs}
        results.append({"case": case, "events_per_s": {s: [r["events_per_s"] for r in runs[s]] for s in runs},
                        "median_events_per_s": med, "new_over_old": round(med["new"] / med["old"], 4),
                        "events_per_cpu_s": {s: [r["events_per_cpu_s"] for r in runs[s]] for s in runs},
                        "median_events_per_cpu_s": med_cpu,
                        "new_over_old_cpu": round(med_cpu["new"] / med_cpu["old"], 4),
                        "sim_wall_s": {s: [r["sim_wall_s"] for r in runs[s]] for s in runs},
                        "total_wall_s": {s: [r["total_wall_s"] for r in runs[s]] for s in runs},
                        "hot_path": {s: runs[s][0]["hot_path"] for s in runs},
                        "peak_rss_mb": {s: max(r["peak_rss_mb"] for r in runs[s]) for s in runs},
                        "preemptions": {s: runs[s][0]["preemptions"] for s in runs},
                        "recomputed_tokens": {s: runs[s][0]["recomputed_tokens"] for s in runs},
                        "events": {s: runs[s][0]["events"] for s in runs},
                        "same_events_and_latencies": len(same) == 1})
        print(f"{case:16s} new/old {med['new'] / med['old']:.3f} (per CPU second {med_cpu['new'] / med_cpu['old']:.3f})",
              flush=True)
    Path(args.out).write_text(json.dumps({"machine": machine_info(), "old": args.old_python or str(trees["old"]),
                                          "new": args.new_python or str(ROOT), "new_args": args.new_args, "old_args": args.old_args,
                                          "load_average": {"start": load0, "end": os.getloadavg()},
                                          "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
