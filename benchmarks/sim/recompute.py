"""Which recompute wins on a split cluster whose token machines run out of KV (issue 41, item 3).

A decode preempted on its token machine (KV on demand: it could not get its next block) needs
its KV again. `--recompute in-place`: it recomputes its prompt and outputs there, at the head of
that machine's prompt queue (a prefill in the token machine's next step). `--recompute
prompt-pool`: it is admitted again as at its arrival (policy/cluster.py readmit): a token
machine reserves its blocks, a prompt machine recomputes them, the KV is sent again.

This script simulates split clusters under memory pressure (a low --memory-utilization leaves
the token machines tens of thousands of KV tokens) with both, and with `--kv-allocation reserve`
for reference, over a grid of rates and seeds, and writes every run and a summary:

    python benchmarks/sim/recompute.py [--quick] [--workers 2] [--out benchmarks/sim/recompute.json]

Per run: TTFT / TBT / E2E P50 / P90 / P99 (TBT also P99.9, from every token's time), throughput,
preemptions, recomputed tokens, KV transfers, the Splitwise SLOs (summary.json's `slo.met`) and
the stall of the preempted requests (their longest gap between two tokens). Per setup and rule:
the capacity, the highest rate of the grid at which the SLOs hold at it and every lower rate
(median over seeds). See benchmarks/sim/README.md for the results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT.parent / "shared" / "profiles" / "splitwise_a100_h100_perf_model.csv"

# name -> (serving system, workload, prompt machines, token machines, memory utilization, rates).
# Splitwise-HH (DGX-H100, llama2-70b, tp 8, the authors' profile). Conversation and coding: the
# paper's iso-power clusters at a fifth of their size (25P+15T -> 5P+3T; 35P+5T -> 7P+1T, here
# 7P+2T); ShareGPT (short prompts, long outputs: the decodes grow most) on 2P+4T. An instance
# holds 42,783 KV tokens at memory utilization 0.24, about 33,000 at 0.235 and 23,252 at 0.23
# (1,331,846 at the default 0.9).
SETUPS: dict[str, tuple[str, str, int, int, float, list[float]]] = {
    "distserve-sharegpt-mu0.23": ("distserve", "sharegpt", 2, 4, 0.23, [8, 9, 10, 10.5, 11, 11.5, 12, 13, 14, 16, 20]),
    "splitwise-sharegpt-mu0.23": ("splitwise", "sharegpt", 2, 4, 0.23, [10, 12, 13, 14, 15, 16, 17, 18, 20, 22]),
    "distserve-conversation-mu0.24": ("distserve", "conversation", 5, 3, 0.24, [6, 7, 7.5, 8, 8.5, 9, 10, 11, 12]),
    "distserve-conversation-mu0.235": ("distserve", "conversation", 5, 3, 0.235, [4, 5, 5.5, 6, 6.5, 7, 8, 9, 10]),
    "splitwise-conversation-mu0.24": ("splitwise", "conversation", 5, 3, 0.24,
                                      [8, 10, 11, 12, 12.5, 13, 13.5, 14, 15, 16]),
    "distserve-coding-mu0.23": ("distserve", "coding", 7, 2, 0.23, [4, 5, 6, 8, 10, 12]),
}
RULES = {   # policy settings over the system's (policy/systems.py)
    "in-place": {"batching.kv_allocation": "on-demand", "batching.recompute": "in-place"},
    "prompt-pool": {"batching.kv_allocation": "on-demand", "batching.recompute": "prompt-pool"},
    "reserve": {"batching.kv_allocation": "reserve"},
}
SEEDS = (0, 1, 2, 3, 4)
DURATION = 600.0


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run_one(job: tuple[str, str, float, int, float]) -> dict:
    """One simulation: (setup, rule, rate, seed, duration) -> its figures."""
    from splitserve.policy.config import make_policy
    from splitserve.sim.run import run_simulation

    setup, rule, rate, seed, duration = job
    system, workload, p, t, mu, _ = SETUPS[setup]
    s, res = run_simulation(design="splitwise-hh", model="llama2-70b", prompt_machines=p, token_machines=t,
                            workload=workload, rps=rate, duration=duration, seed=seed, memory_utilization=mu,
                            policy=make_policy(RULES[rule], system),
                            profile=str(PROFILE) if PROFILE.exists() else None,
                            record_requests=True, return_result=True)
    gaps: list[float] = []
    stalls: list[float] = []
    for r in res.requests:
        tt = r.token_times or []
        g = [b - a for a, b in zip(tt, tt[1:])]
        gaps += g
        if r.preemptions and g:
            stalls.append(max(g))
    c, kv = s["cluster"], s["kv_transfer"]
    pools = {m["pool"]: m for m in c["machines"]}
    return {
        "setup": setup, "rule": rule, "rate": rate, "seed": seed, "duration_s": duration,
        "requests": s["requests"], "completed": s["completed"], "throughput_rps": s["throughput_rps"],
        "ttft_s": {k: s["ttft_s"][k] for k in ("p50", "p90", "p99")},
        "tbt_s": {**{k: s["tbt_s"][k] for k in ("p50", "p90", "p99")}, "p999": _pct(gaps, 0.999)},
        "e2e_s": {k: s["e2e_s"][k] for k in ("p50", "p90", "p99")},
        "slo_met": s["slo"]["met"],
        "slo_failed": sorted(k for k, v in s["slo"]["checks"].items() if not v["met"]),
        "preemptions": c["preemptions"], "recomputed_tokens": c["recomputed_tokens"],
        "preempted_requests": sum(1 for r in res.requests if r.preemptions),
        "stall_s": {"p50": _pct(stalls, 0.5), "p90": _pct(stalls, 0.9), "max": max(stalls) if stalls else None},
        "kv_transfers": kv["transfers"], "kv_bytes": kv["bytes"],
        "borrowed_into_mixed_pool": c["borrowed_into_mixed_pool"],
        "token_pool_peak_kv": pools.get("token", {}).get("peak_kv_fraction"),
        "prompt_pool_utilization": pools.get("prompt", {}).get("utilization"),
        "events": s["sim"]["events"],
    }


def capacity(runs: list[dict]) -> float:
    """The highest rate at which the SLOs hold at it and every lower rate (0: none)."""
    best = 0.0
    for r in sorted(runs, key=lambda r: r["rate"]):
        if not r["slo_met"]:
            break
        best = r["rate"]
    return best


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def summarise(runs: list[dict]) -> dict:
    """Per setup and rule: capacity per seed and its median; per rate the seeds' means."""
    out: dict = {}
    for setup in dict.fromkeys(r["setup"] for r in runs):
        out[setup] = {}
        for rule in dict.fromkeys(r["rule"] for r in runs if r["setup"] == setup):
            mine = [r for r in runs if r["setup"] == setup and r["rule"] == rule]
            caps = [capacity([r for r in mine if r["seed"] == s]) for s in sorted({r["seed"] for r in mine})]
            rates = {}
            for rate in sorted({r["rate"] for r in mine}):
                at = [r for r in mine if r["rate"] == rate]
                rates[str(rate)] = {
                    "slo_met": sum(r["slo_met"] for r in at), "seeds": len(at),
                    "throughput_rps": _mean([r["throughput_rps"] for r in at]),
                    **{f"{m}_{q}": _mean([r[m][q] for r in at]) for m in ("ttft_s", "tbt_s", "e2e_s")
                       for q in ("p50", "p90", "p99")},
                    "tbt_s_p999": _mean([r["tbt_s"]["p999"] for r in at]),
                    "preemptions": _mean([r["preemptions"] for r in at]),
                    "preempted_requests": _mean([r["preempted_requests"] for r in at]),
                    "recomputed_tokens": _mean([r["recomputed_tokens"] for r in at]),
                    "stall_s_p50": _mean([r["stall_s"]["p50"] for r in at]),
                    "kv_transfers": _mean([r["kv_transfers"] for r in at]),
                    "requests": _mean([r["requests"] for r in at]),
                }
            out[setup][rule] = {"capacity_rps": caps, "capacity_rps_median": statistics.median(caps),
                                "max_throughput_rps": max(v["throughput_rps"] for v in rates.values()),
                                "rates": rates}
    return out


def _round(x):
    """`x` with its floats to 6 significant digits (the JSON's size)."""
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v) for v in x]
    return x


def write(doc: dict, path: Path) -> None:
    """The results as JSON: the summary indented, each run on one line."""
    doc = _round(doc)
    head = json.dumps({k: v for k, v in doc.items() if k != "runs"}, indent=1)
    runs = ",\n".join("  " + json.dumps(r, separators=(",", ":")) for r in doc["runs"])
    path.write_text(head[:-2] + ',\n "runs": [\n' + runs + "\n ]\n}\n")


def machine_info() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    import splitserve
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "commit": commit,
            "splitserve": str(Path(splitserve.__file__).parent), "load_average": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--duration", type=float, default=DURATION)
    ap.add_argument("--quick", action="store_true", help="one seed, 120 s runs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).with_name("recompute.json")))
    args = ap.parse_args()
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    duration = 120.0 if args.quick else args.duration
    jobs = [(setup, rule, float(rate), seed, duration) for setup in args.setups.split(",")
            for rule in args.rules.split(",") for rate in SETUPS[setup][5] for seed in seeds]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        runs = list(pool.map(run_one, jobs))
    for r in runs:
        print(f"{r['setup']:32s} {r['rule']:11s} {r['rate']:5.1f} s{r['seed']} slo={r['slo_met']!s:5} "
              f"tput={r['throughput_rps']:.2f} ttft50={r['ttft_s']['p50']:.3f} ttft99={r['ttft_s']['p99']:.2f} "
              f"tbt99={r['tbt_s']['p99'] * 1e3:.0f}ms e2e50={r['e2e_s']['p50']:.2f} pre={r['preemptions']} "
              f"recomp={r['recomputed_tokens']} xfer={r['kv_transfers']}")
    from splitserve.sim import compiled
    setups = {k: dict(zip(("system", "workload", "prompt_machines", "token_machines", "memory_utilization",
                           "rates"), v)) for k, v in SETUPS.items() if k in args.setups.split(",")}
    doc = {"machine": machine_info(), "hot_path": "compiled with mypyc" if compiled() else "pure Python",
           "wall_s": round(time.perf_counter() - t0, 1), "duration_s": duration, "seeds": seeds,
           "model": "llama2-70b", "design": "splitwise-hh", "profile": PROFILE.name if PROFILE.exists() else None,
           "setups": setups, "rules": RULES, "summary": summarise(runs), "runs": runs}
    write(doc, Path(args.out))
    print(f"wrote {args.out} ({len(runs)} runs, {doc['wall_s']} s)")


if __name__ == "__main__":
    main()
