"""Provisioning search speed (issue: cluster provisioning search).

    python benchmarks/provision_speed.py [--workers 2] [--check-grid 20x6]
        [--out benchmarks/results/provision_speed.json]

1. The cost-optimal Splitwise-HH cluster for 70 req/s of coding (llama2-70b, 120 s of arrivals,
   seed 0, the Splitwise authors' profile when ../shared is present) over up to 70 x 70 splits,
   with an empty cache: wall time and simulations against the 4,900 of brute force.
2. The same question with the cache warm (the re-run).
3. A check of the answer: brute force over the corner of the grid that holds it (all splits up
   to --check-grid), counting any pair of neighbours where more machines missed the SLO that
   fewer met (a breach of the monotonicity the search assumes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT.parent / "shared" / "profiles" / "splitwise_a100_h100_perf_model.csv"


def main() -> None:
    from splitserve.provision import plan
    from splitserve.provision.command import run_provision
    from splitserve.provision.request import ProvisionRequest
    from splitserve.provision.evaluate import Evaluator, LocalBackend

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--check-grid", default="20x6")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "provision_speed.json"))
    args = ap.parse_args()
    profile = str(PROFILE) if PROFILE.exists() else None
    kw = dict(objective="cost", rps=70.0, constraint=None, budget=None, designs=["splitwise-hh"],
              workload="coding", duration=120.0, seed=0, profile=profile, max_prompt=70,
              max_token=70, workers=args.workers, progress=False)
    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        cold = run_provision(ProvisionRequest(**kw, cache_dir=cache))
        cold_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        warm = run_provision(ProvisionRequest(**kw, cache_dir=cache))
        warm_s = time.perf_counter() - t0
    best = cold["best"]
    print(f"search: {best['prompt_machines']}P+{best['token_machines']}T ${best['cost_per_hour']:.0f}/h, "
          f"{cold['search']['simulated']} simulations vs 4,900, {cold_s:.1f} s; re-run {warm_s:.2f} s")

    P, T = map(int, args.check_grid.split("x"))
    ev = Evaluator(LocalBackend(args.workers))
    sc = plan.Scenario("coding", 120.0, 0, "llama2-70b", profile)
    grid = [(p, t) for p in range(1, P + 1) for t in range(1, T + 1)]
    t0 = time.perf_counter()
    met = {pt: o.slo_met for pt, o in zip(grid, ev([sc.job("splitwise-hh", pt, 70.0) for pt in grid]))}
    brute_s = time.perf_counter() - t0
    ev.close()
    ok = [pt for pt, m in met.items() if m]
    brute = min(ok, key=lambda pt: (pt[0] + pt[1], pt[0] + pt[1], pt[0])) if ok else None
    breaches = [(a, b) for a in grid for b in ((a[0] + 1, a[1]), (a[0], a[1] + 1))
                if b in met and met[a] and not met[b]]
    print(f"brute force over {P}x{T}: {brute}, {len(grid)} simulations in {brute_s:.1f} s; "
          f"monotonicity breaches: {len(breaches)}")
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    rec = {
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
                    "workers": args.workers},
        "question": "cost-optimal splitwise-hh, llama2-70b, coding 70 req/s, 120 s, seed 0, up to 70x70",
        "perf_model": "profile" if profile else "roofline",
        "answer": {k: best[k] for k in ("prompt_machines", "token_machines", "cost_per_hour",
                                        "worst_check", "worst_ratio")},
        "cold": {"wall_s": round(cold_s, 1), "simulated": cold["search"]["simulated"], "brute_force": 4900},
        "warm": {"wall_s": round(warm_s, 2), "simulated": warm["search"]["simulated"],
                 "cached": warm["search"]["cached"]},
        "check": {"grid": [P, T], "simulations": len(grid), "wall_s": round(brute_s, 1),
                  "brute_force_answer": brute, "same_answer": list(brute or ()) ==
                  [best["prompt_machines"], best["token_machines"]],
                  "monotonicity_breaches": [list(map(list, b)) for b in breaches]},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rec, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
