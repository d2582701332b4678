"""Splitwise against the baseline on the same hardware: TTFT, TBT and E2E side by side.

On this CPU machine (the defaults: the `tiny` preset, 1 prompt + 1 token worker against 2 mixed
workers, the coding workload at 16 req/s for 30 s, prompts capped at 200 tokens and outputs at 32;
about 80 s). On 2 cores, 4 to 16 req/s gave the same latencies (the floor), at 32 the tails grew
and at 48 the machine was about 80% busy (server, workers and the bench client together) and
Splitwise's TTFT P90 had doubled; 16 loads the machine without overloading it.

    python benchmarks/serve/split_vs_baseline.py

On one NVIDIA GPU (llama3-8b shape, random weights; both designs' two workers share the GPU, so
--num-blocks keeps each KV cache at 12 GiB; no caps, and prompt + output clipped to the model's
8,192-token context; the rate is a starting point, raise it until TTFT P99 climbs):

    python benchmarks/serve/split_vs_baseline.py --model llama3-8b --device cuda --dtype bfloat16 \\
        --num-blocks 6144 --max-prompt-tokens 0 --max-tokens-cap 0 --max-context 8192 \\
        --rps 4 --duration 60 --out benchmarks/serve/split_vs_baseline_gpu.json

The script starts, one after the other (same model, device, dtype and number of workers):

    splitserve serve --design splitwise --prompt-workers P --token-workers T ...
    splitserve serve --design baseline --mixed-workers P+T ...

sends each --warmup short requests (a 16-token prompt, 4 tokens out), then runs

    splitserve bench --url ... --workload W --rps R --duration S --seed SEED --out DIR/<design> --json
        [--max-prompt-tokens A] [--max-tokens-cap B] [--max-context C]

against it (the same arrivals and sizes for both designs), reads DIR/<design>/summary.json, and
reads the server's /metrics for its KV transfers, failures, restarts and rejections. A table of
TTFT / TBT / E2E P50, P90 and P99, the outcomes and the throughput follows, and everything goes
to --out. A server that does not start or a bench that fails is reported as an error (the other
design still runs) and the script exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from live import (TICK, exit_on_sigterm, finish, free_port, header, machine_busy, running, scrape,  # this folder
                  serve_cmd, shell)

ROWS = [("TTFT ms", "ttft_s", 1e3), ("TBT ms", "tbt_s", 1e3), ("E2E s", "e2e_s", 1.0)]


def bench_cmd(args, base: str, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "splitserve.cli", "bench", "--url", base, "--workload", args.workload,
           "--rps", f"{args.rps:g}", "--duration", f"{args.duration:g}", "--seed", str(args.seed),
           "--timeout", f"{args.request_timeout:g}", "--out", str(out), "--json"]
    for flag, value in (("--max-prompt-tokens", args.max_prompt_tokens), ("--max-tokens-cap", args.max_tokens_cap),
                        ("--max-context", args.max_context)):
        if value:
            cmd += [flag, str(value)]
    return cmd


def server_counters(base: str) -> dict:
    m = scrape(base)
    out = {}
    for mode in ("layerwise", "serialized"):
        out[f"kv_transfers_{mode}"] = m.get(f'splitserve_kv_transfers_total{{mode="{mode}"}}', 0.0)
        out[f"kv_exposed_s_{mode}"] = m.get(f'splitserve_kv_transfer_exposed_seconds_total{{mode="{mode}"}}', 0.0)
    for key in ("kv_transfer_failures", "request_restarts", "worker_restarts"):
        out[key] = m.get(f"splitserve_{key}_total", 0.0)
    out["rejected"] = sum(v for k, v in m.items() if k.startswith("splitserve_rejected_total"))
    return out


def run_design(args, design: str, runs_dir: Path, log: Path) -> dict:
    port = free_port()
    workers = (["--prompt-workers", str(args.prompt_workers), "--token-workers", str(args.token_workers)]
               if design == "splitwise" else ["--mixed-workers", str(args.prompt_workers + args.token_workers)])
    extra = ["--num-blocks", str(args.num_blocks)] if args.num_blocks else []
    cmd = serve_cmd("--design", design, *workers, "--model", args.model, "--device", args.device,
                    "--dtype", args.dtype, "--transport", args.transport, "--worker-threads",
                    str(args.worker_threads), *extra, "--port", str(port))
    base = f"http://127.0.0.1:{port}"
    out = runs_dir / design
    bcmd = bench_cmd(args, base, out)
    res: dict = {"design": design, "serve_command": shell(cmd), "bench_command": shell(bcmd)}
    print(f"== {design}: {shell(cmd)}", flush=True)
    t0 = time.perf_counter()
    try:
        with running(cmd, port, timeout=args.startup_timeout, log=log):
            res["startup_s"] = time.perf_counter() - t0
            with httpx.Client(timeout=args.request_timeout) as c:
                for i in range(args.warmup):
                    r = c.post(f"{base}/v1/completions", json={"prompt": list(range(10, 26)), "max_tokens": 4,
                                                               "temperature": 0, "ignore_eos": True})
                    if r.status_code != 200:
                        raise RuntimeError(f"warm-up request answered {r.status_code}: {r.text[:500]}")
            before = server_counters(base)
            print(f"   {shell(bcmd)}", flush=True)
            b0, w0 = machine_busy(), time.monotonic()
            p = subprocess.run(bcmd, capture_output=True, text=True,
                               timeout=args.duration + args.request_timeout + 120)
            b1, w1 = machine_busy(), time.monotonic()
            if b0 is not None and b1 is not None:  # everything on the machine: server, workers, bench client
                res["machine_cpu_pct_of_all_cores"] = 100.0 * (b1 - b0) / (TICK * (w1 - w0) * (os.cpu_count() or 1))
            if p.returncode != 0:
                raise RuntimeError(f"splitserve bench exited with status {p.returncode}:\n{p.stderr[-3000:]}")
            after = server_counters(base)
        res["summary"] = json.loads((out / "summary.json").read_text())
        res["server"] = {k: after[k] - before[k] for k in after}
    except Exception as e:  # reported, not hidden: the other design still runs
        res["error"] = f"{type(e).__name__}: {e}"
        print(f"   ERROR: {res['error']}", file=sys.stderr, flush=True)
    res["wall_s"] = time.perf_counter() - t0
    return res


def _f(x, scale: float) -> str:
    return "-" if x is None else f"{x * scale:.1f}" if x * scale >= 100 else f"{x * scale:.2f}"


def table(runs: list[dict]) -> str:
    cols = [(f"{r['design']} ({r['label']})", r) for r in runs]
    w = max(24, *(len(c[0]) for c in cols))
    lines = [f"{'':22s}" + "".join(f"{name:>{w}s}" for name, _ in cols)]
    lines.append("-" * len(lines[0]))

    def row(label: str, fn) -> None:
        lines.append(f"{label:22s}" + "".join(f"{fn(r):>{w}s}" for _, r in cols))

    for label, key, scale in ROWS:
        row(f"{label} P50/P90/P99", lambda r, key=key, scale=scale: "error" if "summary" not in r else
            " / ".join(_f(r["summary"][key].get(q), scale) for q in ("p50", "p90", "p99")))
    row("requests", lambda r: str(r["summary"]["requests"]) if "summary" in r else "error")
    row("completed/failed/rej.", lambda r: "error" if "summary" not in r else
        f"{r['summary']['completed']} / {r['summary']['failed']} / {r['summary']['bench']['rejected']}")
    row("throughput req/s", lambda r: "error" if "summary" not in r else
        f"{r['summary']['throughput_rps']:.2f} (offered {r['summary'].get('offered_rps') or 0:.2f})")
    row("tokens generated", lambda r: str(r["summary"]["tokens_generated"]) if "summary" in r else "error")
    row("KV transfers (lw/ser)", lambda r: "error" if "server" not in r else
        f"{r['server']['kv_transfers_layerwise']:g} / {r['server']['kv_transfers_serialized']:g}")
    row("machine CPU % (bench)", lambda r: f"{r['machine_cpu_pct_of_all_cores']:.0f}%"
        if "machine_cpu_pct_of_all_cores" in r else "-")
    row("KV fail/restarts", lambda r: "error" if "server" not in r else
        f"{r['server']['kv_transfer_failures']:g} / {r['server']['request_restarts']:g}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="preset or checkpoint directory (default: %(default)s)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: %(default)s)")
    ap.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto (default: %(default)s)")
    ap.add_argument("--prompt-workers", type=int, default=1, help="Splitwise prompt workers (default: %(default)s)")
    ap.add_argument("--token-workers", type=int, default=1,
                    help="Splitwise token workers; the baseline gets prompt + token mixed workers "
                         "(default: %(default)s)")
    ap.add_argument("--designs", default="splitwise,baseline",
                    help="comma-separated, run in this order (default: %(default)s)")
    ap.add_argument("--transport", default="tcp", help="Splitwise KV transport: tcp or local (default: %(default)s)")
    ap.add_argument("--num-blocks", type=int, default=0,
                    help="KV blocks per worker, 0: the engine's default (needed on one shared GPU) "
                         "(default: %(default)s)")
    ap.add_argument("--worker-threads", type=int, default=1, help="torch threads per worker (default: %(default)s)")
    ap.add_argument("--workload", default="coding", help="coding, conversation or a trace CSV (default: %(default)s)")
    ap.add_argument("--rps", type=float, default=16.0, help="mean arrival rate, requests/s (default: %(default)s)")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="workload seed (default: %(default)s)")
    ap.add_argument("--max-prompt-tokens", type=int, default=200,
                    help="cap on each prompt, 0: none (CHANGES the workload) (default: %(default)s)")
    ap.add_argument("--max-tokens-cap", type=int, default=32,
                    help="cap on each output, 0: none (CHANGES the workload) (default: %(default)s)")
    ap.add_argument("--max-context", type=int, default=0,
                    help="clip prompt + output to this many tokens, 0: no clip (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=3, help="short requests before each bench (default: %(default)s)")
    ap.add_argument("--startup-timeout", type=float, default=240.0,
                    help="seconds for a server to answer /health (default: %(default)s)")
    ap.add_argument("--request-timeout", type=float, default=120.0,
                    help="seconds one request may take (bench --timeout) (default: %(default)s)")
    ap.add_argument("--runs-dir", type=Path, default=None,
                    help="keep bench outputs (summary.json, requests.jsonl) and server logs here "
                         "(default: a temporary directory, removed)")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("split_vs_baseline.json"),
                    help="results JSON (default: %(default)s)")
    args = ap.parse_args()
    designs = [d for d in args.designs.split(",") if d]
    if bad := [d for d in designs if d not in ("splitwise", "baseline")]:
        ap.error(f"--designs: unknown {bad}; use splitwise, baseline")
    if args.prompt_workers < 1 or args.token_workers < 1:
        ap.error("--prompt-workers and --token-workers must be at least 1")
    exit_on_sigterm()
    results: dict = {
        **header("split_vs_baseline"), "model": args.model, "device": args.device,
        "dtype": args.dtype, "workload": args.workload, "rps": args.rps, "duration_s": args.duration,
        "seed": args.seed, "caps": {"max_prompt_tokens": args.max_prompt_tokens or None,
                                    "max_tokens_cap": args.max_tokens_cap or None,
                                    "max_context": args.max_context or None},
        "warmup_requests": args.warmup, "runs": [],
    }
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = args.runs_dir or Path(tmp)
        runs_dir.mkdir(parents=True, exist_ok=True)
        for d in designs:
            r = run_design(args, d, runs_dir, runs_dir / f"serve-{d}.log")
            r["label"] = (f"{args.prompt_workers}P+{args.token_workers}T" if d == "splitwise"
                          else f"{args.prompt_workers + args.token_workers} mixed")
            results["runs"].append(r)
    results["wall_s"] = time.perf_counter() - t0
    print()
    print(table(results["runs"]))
    return finish(results, args.out, lambda r: r["design"])


if __name__ == "__main__":
    sys.exit(main())
