"""Results event for event identical across a refactor: run the same simulations with two source
trees and compare their outputs, timing left out.

    # outputs of a tree (PYTHONPATH picks the tree; the installed splitserve otherwise)
    PYTHONPATH=/path/to/old/src python benchmarks/identical.py run --out /tmp/old [--heavy]
    python benchmarks/identical.py run --out /tmp/new [--heavy]
    python benchmarks/identical.py diff /tmp/old /tmp/new

    # a change that adds an option: the new tree at the old behaviour, the new keys left out
    python benchmarks/identical.py run --out /tmp/new --extra "--kv-allocation reserve"
    python benchmarks/identical.py diff /tmp/old /tmp/new --ignore kv-allocation,recomputed_tokens,recompute

`run` simulates every serving system of policy/systems.py on the coding and conversation workloads,
the prefix caches on the multiturn and sysprompt workloads
(summary.json, events counted), every machine-level scheduler, the twin's measured machine, a
pipelined and a mixed-hardware cluster; with --heavy also `compare --quick` and the four
neighbours' reproductions at quick scale (results.json). `diff` compares every JSON file of the
two directories with the keys that time the run itself (wall_s, events_per_s, ...) removed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT.parent / "shared" / "profiles" / "splitwise_a100_h100_perf_model.csv"
TWIN = ROOT / "benchmarks" / "twin" / "results" / "profile"
SYSTEMS = ("vllm", "sarathi", "aladdin", "ecoserve", "splitwise", "distserve", "tetriinfer")
SCHEDULERS = ("vllm", "orca", "sarathi", "fastertransformer", "lightllm", "tetriinfer-sjf",
              "tetriinfer-ljf", "ecoserve")
TIMING = {"wall_s", "events_per_s", "requests_per_s", "elapsed_s", "created", "generated_at",
          "duration_s_wall", "cpu", "platform", "python", "cache_dir", "out", "version", "commit"}


def cases() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for wl in ("coding", "conversation"):
        for s in SYSTEMS:
            out[f"sim-{s}-{wl}"] = ["simulate", "--policy", s, "--workload", wl, "--rps", "12"]
        out[f"sim-splitwise-profile-{wl}"] = ["simulate", "--workload", wl, "--profile", str(PROFILE),
                                              "-p", "6", "-t", "2", "--rps", "20"]
    for s in SCHEDULERS:
        out[f"sched-{s}"] = ["simulate", "--design", "baseline-h100", "-m", "3", "--machine-scheduler", s,
                             "--rps", "8", "--duration", "60"]
    out["pp2"] = ["simulate", "--tp", "4", "--pp", "2", "-p", "3", "-t", "2", "--duration", "60"]
    out["mixed-hw"] = ["simulate", "-p", "2*dgx-h100+1*dgx-a100", "-t", "2", "--duration", "60"]
    out["chunked"] = ["simulate", "--design", "baseline-h100", "-m", "4", "--chunk-size", "512", "--duration", "60"]
    for wl in ("multiturn", "sysprompt"):   # prefix caches (sim/prefix.py), prefix-aware routing
        out[f"prefix-{wl}"] = ["simulate", "-p", "3", "-t", "2", "--workload", wl, "--rps", "6", "--duration", "60"]
        out[f"prefix-{wl}-jsq"] = ["simulate", "--policy", "vllm", "--workload", wl, "--rps", "6", "--duration", "60"]
    out["twin"] = ["simulate", "--machine-profile", str(TWIN), "-p", "1", "-t", "1", "--rps", "4",
                   "--duration", "30"]
    out["twin-baseline"] = ["simulate", "--design", "baseline-h100", "--machine-profile", str(TWIN), "-m", "1",
                            "--rps", "3", "--duration", "30"]
    return out


def heavy() -> dict[str, list[str]]:
    out = {"compare-quick": ["compare", "--quick", "--no-cache", "--workers", "2", "-q"]}
    out["reproduce-distserve"] = ["reproduce", "distserve", "--scale", "quick", "--no-cache", "--workers", "2"]
    for r in ("tetriinfer", "ecoserve", "aladdin"):  # these three simulate in-process, uncached
        out[f"reproduce-{r}"] = ["reproduce", r, "--scale", "quick"]
    return out


def run(args: argparse.Namespace) -> None:
    dest = Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)
    todo = {**cases(), **(heavy() if args.heavy else {})}
    for name, argv in todo.items():
        if args.only and name not in args.only.split(","):
            continue
        d = dest / name
        d.mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "splitserve.cli", *argv, "--out", str(d)]
        if argv[0] == "simulate":
            cmd += ["--json", "--seed", "0", *args.extra.split()]
        p = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
        (d / "stderr.txt").write_text(p.stderr)
        print(f"{name:32s} rc={p.returncode}", flush=True)


def strip(x, root: str = "\0", ignore: frozenset = frozenset()):
    """`x` without its timing keys (and the keys `ignore`), the output directory `root` written as <OUT>."""
    if isinstance(x, dict):
        return {k: strip(v, root, ignore) for k, v in x.items() if k not in TIMING and k not in ignore}
    if isinstance(x, list):
        return [strip(v, root, ignore) for v in x]
    if isinstance(x, str):
        return x.replace(root, "<OUT>")
    return x


def diff(args: argparse.Namespace) -> int:
    a, b = Path(args.a), Path(args.b)
    bad = 0
    files = sorted({p.relative_to(a) for p in a.rglob("*.json")} | {p.relative_to(b) for p in b.rglob("*.json")})
    for rel in files:
        pa, pb = a / rel, b / rel
        if not pa.exists() or not pb.exists():
            print(f"MISSING {rel}")
            bad += 1
            continue
        ignore = frozenset(filter(None, args.ignore.split(",")))
        if strip(json.loads(pa.read_text()), str(a), ignore) != strip(json.loads(pb.read_text()), str(b), ignore):
            print(f"DIFFERS {rel}")
            bad += 1
    print(f"{len(files)} files, {bad} differ or are missing")
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--heavy", action="store_true")
    r.add_argument("--only", default="")
    r.add_argument("--extra", default="", help="options added to every simulate command")
    d = sub.add_parser("diff")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--ignore", default="", help="keys left out of the comparison, comma-separated")
    args = ap.parse_args()
    if args.cmd == "run":
        run(args)
    else:
        sys.exit(diff(args))


if __name__ == "__main__":
    main()
