"""Simulator speed with each serving system's policy (issue 16: each within 2x of Splitwise's
events per second), side by side in one run:

    python benchmarks/policy_speed.py [--out benchmarks/results/policy_speed.json]

One case for all: llama2-70b on DGX-H100s, conversation at 40 req/s for 600 s, 8 prompt + 8 token
machines (an unsplit system runs the 16 mixed), roofline model, seed 0. Each system runs in a fresh
process pinned to core 0, its best of --repeat runs kept (the VM is shared).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_speed import machine_info  # noqa: E402

CASE = dict(workload="conversation", rps=40.0, duration=600.0, prompt_machines=8, token_machines=8)


def run_system(name: str) -> dict:
    from splitserve.policy.config import make_policy
    from splitserve.sim.run import run_simulation

    s = run_simulation(design="splitwise-hh", model="llama2-70b", seed=0, policy=make_policy({}, name), **CASE)
    return {"system": name, "requests": s["requests"], "completed": s["completed"], "events": s["sim"]["events"],
            "sim_wall_s": round(s["sim"]["wall_s"], 3), "events_per_s": round(s["sim"]["events_per_s"]),
            "e2e_p50_s": s["e2e_s"]["p50"]}


def main() -> None:
    from splitserve.policy.systems import SYSTEMS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "policy_speed.json"))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--one", help=argparse.SUPPRESS)   # child process: one system
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_system(a.one)))
        return
    rows = []
    for name in SYSTEMS:
        runs = [json.loads(subprocess.run(["taskset", "-c", "0", sys.executable, __file__, "--one", name],
                                          check=True, capture_output=True, text=True).stdout)
                for _ in range(a.repeat)]
        best = max(runs, key=lambda r: r["events_per_s"])
        rows.append(best)
        print(f"{name:12s} {best['events']:>9,} events {best['sim_wall_s']:>7.2f} s {best['events_per_s']:>8,}/s",
              file=sys.stderr)
    base = next(r for r in rows if r["system"] == "splitwise")
    for r in rows:
        r["events_per_s_vs_splitwise"] = round(r["events_per_s"] / base["events_per_s"], 2)
        r["wall_vs_splitwise"] = round(r["sim_wall_s"] / base["sim_wall_s"], 2)
    Path(a.out).write_text(json.dumps({"machine": machine_info(), "case": CASE, "rows": rows}, indent=2) + "\n")
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
