"""Simulator speed and memory at datacenter scale (issue: the fast phase-splitting simulator).

Each case runs in its own process pinned to one core, so its peak RSS is its own:

    python benchmarks/sim_speed.py [--cases coding-1h,...] [--out benchmarks/results/sim_speed.json]

Cases (llama2-70b, the Splitwise authors' profile when ../shared is present, else roofline):
  coding-1h         Splitwise-HH 35P+5T, coding, 70 req/s, 3600 s  (the target: < 60 s on one core)
  coding-120s       the same for 120 s (8,431 requests: SplitwiseSim's question, issue 29)
  coding-10min      the same for 600 s: peak memory must not grow with trace length
  conversation-1h   Splitwise-HH 25P+15T (the paper's iso-power conversation cluster), 70 req/s, 3600 s
  coding-400m-1h    Splitwise-HH 350P+50T (400 machines), coding, 700 req/s, 3600 s
  conversation-lowmem-1h  conversation-1h at --memory-utilization 0.24 (42,783 KV tokens a machine),
                    memory pressure (issue 41): 1,148 preemptions under reserve, 123 on demand

Whole commands, start-up and output included (issue 44): `splitserve simulate` of each case as a
user runs it, alternating two installs (an old and a new `pip install --target DIR .`), each run
pinned to one core:

    python benchmarks/sim_speed.py --whole OLD_DIR,NEW_DIR [--pairs 3] [--cases coding-1h,coding-120s]
        [--core 1] [--out benchmarks/results/sim_whole.json]

`--kv-allocation reserve|on-demand` runs a case under that rule (issue 41; left out: the tree's
default, reserve, so that a tree older than the option runs too), `--recompute` where the
preempted recompute.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT.parent / "shared" / "profiles" / "splitwise_a100_h100_perf_model.csv"
CASES = {
    "coding-1h": dict(workload="coding", prompt_machines=35, token_machines=5, rps=70, duration=3600),
    "coding-120s": dict(workload="coding", prompt_machines=35, token_machines=5, rps=70, duration=120),
    "coding-10min": dict(workload="coding", prompt_machines=35, token_machines=5, rps=70, duration=600),
    "conversation-1h": dict(workload="conversation", prompt_machines=25, token_machines=15, rps=70, duration=3600),
    "coding-400m-1h": dict(workload="coding", prompt_machines=350, token_machines=50, rps=700, duration=3600),
    "conversation-lowmem-1h": dict(workload="conversation", prompt_machines=25, token_machines=15, rps=70,
                                   duration=3600, memory_utilization=0.24),
}


def run_case(name: str, policy: dict | None = None) -> dict:
    """One run of case `name`; `policy`: policy settings by option path (issue 41's
    batching.kv_allocation, batching.recompute), left out for a tree that has none of them."""
    try:
        from splitserve.sim.run import run_simulation
    except ImportError:             # a tree before the sim/ package (sim_speed_ab.py --old 14cd49c)
        from splitserve.simulate import run_simulation
    from splitserve.sim import simulator

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kw = CASES[name]
    extra = {}
    if policy:
        from splitserve.policy.config import make_policy
        extra["policy"] = make_policy(policy)
    t0, c0 = time.perf_counter(), time.process_time()
    s = run_simulation(design="splitwise-hh", model="llama2-70b", seed=0,
                       profile=str(PROFILE) if PROFILE.exists() else None, **kw, **extra)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"case": name, **kw, "requests": s["requests"], "completed": s["completed"],
            "events": s["sim"]["events"], "sim_wall_s": round(s["sim"]["wall_s"], 2),
            "total_wall_s": round(wall, 2), "events_per_s": round(s["sim"]["events_per_s"]),
            "total_cpu_s": round(cpu, 2), "events_per_cpu_s": round(s["sim"]["events"] / cpu),  # on a busy
            # host a run pinned to a shared core waits: its CPU seconds do not count the wait
            "requests_per_s": round(s["requests"] / s["sim"]["wall_s"]),
            "peak_rss_mb": round(rss / 1024, 1), "rss_after_import_mb": round(rss0 / 1024, 1),
            "slo_met": s["slo"]["met"], "ttft_p50_s": s["ttft_s"]["p50"], "tbt_p50_s": s["tbt_s"]["p50"],
            "perf_model": s["sim"]["perf_model"], **{k.rpartition(".")[2]: v for k, v in (policy or {}).items()},
            "preemptions": s["cluster"].get("preemptions", 0), "recomputed_tokens": s["cluster"].get("recomputed_tokens", 0),
            "hot_path": "pure Python" if simulator.__file__.endswith(".py") else "compiled with mypyc"}


def policy_args(policy: dict) -> list[str]:
    """The command-line options of `policy` ({batching.kv_allocation: ...} -> --kv-allocation ...)."""
    return [a for k, v in policy.items() for a in (f"--{k.rpartition('.')[2].replace('_', '-')}", v)]


def machine_info() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "pinned_to_one_core": True}


SPLITWISESIM_120S = 11.40   # SplitwiseSim's coding-120s, whole process, on a VM like the Xeon one (issue 44)


def command(name: str, out: str) -> list[str]:
    """`splitserve simulate` of case `name` as a user types it (the authors' default rules)."""
    kw = CASES[name]
    return ["simulate", "--design", "splitwise-hh", "--prompt-machines", str(kw["prompt_machines"]),
            "--token-machines", str(kw["token_machines"]), "--model", "llama2-70b", "--workload", str(kw["workload"]),
            "--rps", str(kw["rps"]), "--duration", str(kw["duration"]), "--seed", "0", "--out", out, "-q",
            *(["--memory-utilization", str(kw["memory_utilization"])] if "memory_utilization" in kw else [])]


def whole(sites: list[str], names: list[str], pairs: int, core: str) -> list[dict]:
    """Each case's whole command `pairs` times with each install in `sites` (PYTHONPATH), alternating."""
    results = []
    for name in names:
        walls: dict[str, list[float]] = {site: [] for site in sites}
        for _ in range(pairs):
            for site in sites:
                env = {**os.environ, "PYTHONPATH": site, "OMP_NUM_THREADS": "1"}
                cmd = ["taskset", "-c", core, sys.executable, "-m", "splitserve.cli",
                       *command(name, f"/tmp/sim_whole_{name}")]
                t0 = time.perf_counter()
                subprocess.run(cmd, env=env, check=True, capture_output=True, cwd="/tmp")
                walls[site].append(round(time.perf_counter() - t0, 3))
        old, new = (sorted(walls[s]) for s in (sites[0], sites[-1]))
        r = {"case": name, "command": "splitserve " + " ".join(command(name, "DIR")), "wall_s": walls,
             "median_ratio_old_over_new": round(old[len(old) // 2] / new[len(new) // 2], 2)}
        if name == "coding-120s":
            r["splitwisesim_s"] = SPLITWISESIM_120S
            r["splitwisesim_over_new"] = round(SPLITWISESIM_120S / new[len(new) // 2], 1)
        print(json.dumps(r), flush=True)
        results.append(r)
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--whole", help="OLD_DIR,NEW_DIR: whole commands of two installs, alternating")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--core", default="1")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sim_speed.json"))
    ap.add_argument("--kv-allocation", help="reserve or on-demand (issue 41); left out: the tree's default")
    ap.add_argument("--recompute", help="in-place or prompt-pool (issue 41); left out: the tree's default")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    policy = {f"batching.{k}": v for k, v in (("kv_allocation", args.kv_allocation), ("recompute", args.recompute))
              if v is not None}
    if args.one:
        print(json.dumps(run_case(args.one, policy)))
        return
    if args.whole:
        names = args.cases.split(",") if args.cases != ",".join(CASES) else ["coding-1h", "coding-120s"]
        results = whole(args.whole.split(","), names, args.pairs, args.core)
        out = args.out if args.out != ap.get_default("out") else str(ROOT / "benchmarks" / "results" / "sim_whole.json")
        info = {**machine_info(), "pinned_to_core": args.core, "sites": args.whole.split(",")}
        Path(out).write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")
        print(f"wrote {out}")
        return
    results = []
    for name in args.cases.split(","):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        cmd = ["taskset", "-c", "0", sys.executable, __file__, "--one", name, *policy_args(policy)]
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"{name:16s} {r['requests']:>9,} requests {r['events']:>10,} events in {r['sim_wall_s']:7.1f} s "
              f"({r['events_per_s']:,} events/s), peak RSS {r['peak_rss_mb']} MB", flush=True)
        results.append(r)
    Path(args.out).write_text(json.dumps({"machine": machine_info(), "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
