"""What the operator step model costs the simulator (issue 27: "adds no more than 10% to the
simulator's events/s"): the same off-grid simulation under `--perf-model roofline` and
`--perf-model operators`, alternating, each run in its own process pinned to one core.

    python benchmarks/perf_model_speed.py [--pairs 3] [--out benchmarks/results/perf_model_speed.json]

Case: Llama-2-13B on DGX-A100 at tp 1 (off the Splitwise grid: the operator model answers by
default), Splitwise-AA 24 prompt + 8 token instances, conversation at 30 req/s for 1,800 s.
Reported: events/s of every run, the medians, and operators / roofline of the medians. The two
models give different schedules, so the event counts differ; events/s is the figure compared.
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
CASE = ["--model", "llama2-13b", "--design", "splitwise-aa", "-p", "24", "-t", "8", "--tp", "1",
        "--workload", "conversation", "--rps", "30", "--duration", "1800", "--json", "--quiet"]


def one(perf_model: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = ["taskset", "-c", "0", sys.executable, "-m", "splitserve.cli", "simulate", *CASE, "--perf-model", perf_model]
    s = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
    return {"perf_model": perf_model, "events": s["sim"]["events"], "sim_wall_s": round(s["sim"]["wall_s"], 3),
            "events_per_s": round(s["sim"]["events_per_s"]), "requests": s["requests"],
            "source": s["sim"]["perf_model"], "ttft_p50_s": s["ttft_s"]["p50"], "tbt_p50_s": s["tbt_s"]["p50"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "perf_model_speed.json"))
    a = ap.parse_args()
    runs = []
    for i in range(a.pairs):
        for pm in ("roofline", "operators"):
            runs.append(one(pm))
            print(json.dumps(runs[-1]), file=sys.stderr)
    med = {pm: statistics.median(r["events_per_s"] for r in runs if r["perf_model"] == pm)
           for pm in ("roofline", "operators")}
    out = {"machine": machine_info(), "case": " ".join(CASE), "runs": runs, "median_events_per_s": med,
           "operators_over_roofline": round(med["operators"] / med["roofline"], 3)}
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"events/s median: roofline {med['roofline']:.0f}, operators {med['operators']:.0f}, "
          f"ratio {out['operators_over_roofline']:.3f}")


if __name__ == "__main__":
    main()
