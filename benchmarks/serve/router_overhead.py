"""Front-end + router overhead of `splitserve serve`, measured through HTTP with echo workers.

    python benchmarks/serve/router_overhead.py [--duration 3] [--concurrency 1 2 4 8 16 32 64]
        [--client auto|wrk|httpx] [--wrk-threads 1] [--stacks auto h11-asyncio] [--out results.json]

Echo workers (`--worker-mode echo`, a benchmark tool) return tokens without computing them, so
what is measured is the HTTP front end, request validation, the policy router, the signed
ZeroMQ hop to a worker process and back, and the response. Side by side, in one run:

- `bare`: a FastAPI app under the same uvicorn settings that returns a completion-shaped JSON
  body at once (no router, no worker): the floor that HTTP itself costs on this machine;
- `serve-baseline`: `splitserve serve --design baseline --mixed-workers 1 --worker-mode echo`;
- `serve-splitwise`: `splitserve serve --prompt-workers 1 --token-workers 1 --worker-mode echo`
  (prefill on one worker, a zero-layer KV "transfer", decode on the other).

Each setup runs under each uvicorn stack of `--stacks`: `auto` (httptools and uvloop when they
are installed, as `splitserve serve` runs by default) and `h11-asyncio` (uvicorn's pure-Python
parser and the standard asyncio loop), so the stack's share is a ratio from the same run.

For each: P50/P90/P99 latency of sequential requests (httpx, one at a time, so no queueing;
added P50 = P50(serve) - P50(bare)), and requests/s with N keep-alive connections in flight for
`--duration` seconds, for each N of `--concurrency` (the best is reported). The load client is
`wrk` (C, `--wrk-threads` threads, a Lua script that POSTs the fixed body) when it is on PATH,
else httpx in this process (`--client`). Requests are short: a 3-token prompt, 2 tokens out.

The client shares the machine's cores with the server and its workers. Each throughput run also
records the CPU (percent of one core) used by the server process, its workers, the client, and
everything else on the machine ("other", from /proc/stat); a run where other processes took more
than `--max-other-cpu` is repeated (up to `--attempts` times) after the machine is quiet again,
and flagged `contended` if it never was.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx

from live import TICK, children, free_port, machine, machine_busy, start, stop, versions  # this folder

BODY = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0}
STACKS = {"auto": ("auto", "auto"), "h11-asyncio": ("h11", "asyncio")}  # name -> (http, loop)

BARE_APP = textwrap.dedent('''
    import json, sys, time, uuid, uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import Response
    app = FastAPI()
    @app.post("/v1/completions")
    async def c(request: Request):
        body = json.loads(await request.body())
        out = {"id": "cmpl-" + uuid.uuid4().hex[:24], "object": "text_completion", "created": int(time.time()),
               "model": "tiny", "choices": [{"index": 0, "text": "ab", "token_ids": [8, 9], "logprobs": None,
               "finish_reason": "length"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
        return Response(json.dumps(out, separators=(",", ":")), media_type="application/json")
    @app.get("/health")
    async def h():
        return {"status": "ok"}
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False,
                http=sys.argv[2], loop=sys.argv[3])
''')

WRK_LUA = textwrap.dedent('''
    wrk.method = "POST"
    wrk.body = '%s'
    wrk.headers["Content-Type"] = "application/json"
    done = function(summary, latency, requests)
      local e = summary.errors
      io.write(string.format('WRKJSON {"requests":%%d,"duration_us":%%d,"connect":%%d,"read":%%d,"write":%%d,' ..
        '"status":%%d,"timeout":%%d,"p50_us":%%d,"p90_us":%%d,"p99_us":%%d}\\n', summary.requests,
        summary.duration, e.connect, e.read, e.write, e.status, e.timeout, latency:percentile(50),
        latency:percentile(90), latency:percentile(99)))
    end
''')


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# ---- CPU accounting (Linux /proc; empty elsewhere) ---------------------------------------------
def _proc_ticks(pid: int) -> int:
    """User + system clock ticks of every thread of `pid` so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return int(fields[11]) + int(fields[12])  # utime, stime (all threads)
    except (OSError, IndexError, ValueError):
        return 0


def _self_ticks() -> tuple[float, float]:
    ru, rc = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (ru.ru_utime + ru.ru_stime) * TICK, (rc.ru_utime + rc.ru_stime) * TICK


class CpuMeter:
    """CPU of the server, its workers, the client (this process and the children it waited for, i.e.
    wrk) and everything else, as percent of one core over a measured interval."""

    def __init__(self, server: subprocess.Popen) -> None:
        self.server = server.pid
        self.workers = children(server.pid)

    def begin(self) -> None:
        self.t0 = time.perf_counter()
        self.s0 = _proc_ticks(self.server)
        self.w0 = sum(_proc_ticks(p) for p in self.workers)
        self.c0 = _self_ticks()
        self.m0 = machine_busy()

    def end(self) -> dict:
        wall = time.perf_counter() - self.t0
        s = _proc_ticks(self.server) - self.s0
        w = sum(_proc_ticks(p) for p in self.workers) - self.w0
        me, kids = _self_ticks()
        c = (me - self.c0[0]) + (kids - self.c0[1])
        m = machine_busy()
        if self.m0 is None or m is None or wall <= 0:
            return {}
        f = 100.0 / (TICK * wall)
        out = {"server_pct": s * f, "workers_pct": w * f, "client_pct": c * f, "machine_pct": (m - self.m0) * f}
        out["other_pct"] = max(0.0, out["machine_pct"] - out["server_pct"] - out["workers_pct"] - out["client_pct"])
        return out


def wait_quiet(max_wait: float = 120.0, busy_pct: float = 15.0) -> bool:
    """Wait until the whole machine is under `busy_pct` percent of one core for 2 s."""
    deadline = time.monotonic() + max_wait
    while True:
        m0 = machine_busy()
        time.sleep(2)
        m1 = machine_busy()
        if m0 is None or m1 is None:
            return True
        if (m1 - m0) * 100.0 / (TICK * 2) <= busy_pct:
            return True
        if time.monotonic() > deadline:
            return False


# ---- clients -----------------------------------------------------------------------------------
def sequential(url: str, n: int) -> dict:
    with httpx.Client() as c:
        for _ in range(50):  # warm up
            c.post(url, json=BODY).raise_for_status()
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            r = c.post(url, json=BODY)
            lat.append(time.perf_counter() - t)
            assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == [8, 9], r.text
    return {"n": n, "p50_ms": 1e3 * pct(lat, 0.5), "p90_ms": 1e3 * pct(lat, 0.9), "p99_ms": 1e3 * pct(lat, 0.99),
            "mean_ms": 1e3 * sum(lat) / n}


async def httpx_load(url: str, concurrency: int, duration: float) -> dict:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    ok = bad = 0
    lat: list[float] = []
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        stop_at = time.perf_counter() + duration

        async def loop():
            nonlocal ok, bad
            while time.perf_counter() < stop_at:
                t = time.perf_counter()
                r = await client.post(url, json=BODY)
                lat.append(time.perf_counter() - t)
                if r.status_code == 200:
                    ok += 1
                else:
                    bad += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return {"concurrency": concurrency, "duration_s": wall, "ok": ok, "errors": bad, "rps": ok / wall,
            "p50_ms": 1e3 * pct(lat, 0.5), "p99_ms": 1e3 * pct(lat, 0.99)}


def wrk_load(wrk: str, lua: str, url: str, concurrency: int, duration: float, threads: int) -> dict:
    threads = min(threads, concurrency)
    cmd = [wrk, "-t", str(threads), "-c", str(concurrency), "-d", f"{duration:g}s", "--timeout", "10s",
           "-s", lua, url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    m = re.search(r"^WRKJSON (\{.*\})$", out.stdout, re.M)
    if out.returncode != 0 or m is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout}\n{out.stderr}")
    w = json.loads(m.group(1))
    wall = w["duration_us"] / 1e6
    errors = w["connect"] + w["read"] + w["write"] + w["timeout"] + w["status"]
    ok = w["requests"] - w["status"]
    return {"concurrency": concurrency, "duration_s": wall, "ok": ok, "errors": errors, "rps": ok / wall,
            "p50_ms": w["p50_us"] / 1e3, "p90_ms": w["p90_us"] / 1e3, "p99_ms": w["p99_us"] / 1e3,
            "wrk_errors": {k: w[k] for k in ("connect", "read", "write", "status", "timeout")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per throughput run")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--sequential", type=int, default=1000)
    ap.add_argument("--client", choices=["auto", "wrk", "httpx"], default="auto",
                    help="throughput client: wrk if on PATH (auto), else httpx")
    ap.add_argument("--wrk-threads", type=int, default=1)
    ap.add_argument("--stacks", nargs="+", choices=list(STACKS), default=list(STACKS),
                    help="uvicorn stacks to run every setup under")
    ap.add_argument("--setups", nargs="+", default=["bare", "serve-baseline", "serve-splitwise"])
    ap.add_argument("--max-other-cpu", type=float, default=15.0,
                    help="repeat a throughput run if other processes used more than this (%% of one core)")
    ap.add_argument("--attempts", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    args = ap.parse_args()
    py = sys.executable
    wrk = shutil.which("wrk") if args.client in ("auto", "wrk") else None
    if args.client == "wrk" and wrk is None:
        ap.error("--client wrk: wrk is not on PATH (Debian/Ubuntu: apt-get install wrk)")
    client = "wrk" if wrk else "httpx"

    def serve(port: int, stack: str, *extra: str) -> list[str]:
        http, loop = STACKS[stack]
        return [py, "-m", "splitserve.cli", "serve", "--model", "tiny", "--port", str(port), "--worker-mode", "echo",
                "--max-queue", "4096", "--http-impl", http, "--loop-impl", loop, *extra]

    setups = {
        "bare": lambda port, stack: [py, "-c", BARE_APP, str(port), *STACKS[stack]],
        "serve-baseline": lambda port, stack: serve(port, stack, "--design", "baseline", "--mixed-workers", "1"),
        "serve-splitwise": lambda port, stack: serve(port, stack, "--prompt-workers", "1", "--token-workers", "1"),
    }
    results: dict = {
        "machine": machine(), "versions": versions(), "request": BODY,
        "client": {"throughput": client, "sequential": "httpx (one connection, one request at a time)"},
        "duration_s": args.duration, "max_other_cpu_pct": args.max_other_cpu, "runs": {},
    }
    if wrk:
        v = subprocess.run([wrk, "-v"], capture_output=True, text=True)
        results["client"]["wrk"] = {"version": (v.stdout + v.stderr).splitlines()[0].strip(),
                                    "threads": args.wrk_threads, "connections": "= concurrency",
                                    "keepalive": True, "timeout_s": 10}
    lua_file = None
    if wrk:
        lua_file = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)
        lua_file.write(WRK_LUA % json.dumps(BODY, separators=(",", ":")))
        lua_file.close()
    try:
        for stack in args.stacks:
            for name in args.setups:
                key = name if stack == "auto" else f"{name}@{stack}"
                results["runs"][key] = run_setup(args, setups[name], stack, wrk, lua_file and lua_file.name)
                r = results["runs"][key]
                sweep = ", ".join(f"{t['rps']:.0f}@{t['concurrency']}{'!' if t.get('contended') else ''}"
                                  for t in r["throughput"])
                print(f"{key:28s} sequential P50 {r['sequential']['p50_ms']:.2f} ms  P99 "
                      f"{r['sequential']['p99_ms']:.2f} ms;  req/s@connections ({client}): {sweep}; "
                      f"errors {sum(t['errors'] for t in r['throughput'])}", flush=True)
    finally:
        if lua_file:
            os.unlink(lua_file.name)
    runs = results["runs"]
    results["added_p50_ms"] = {}
    for k, v in runs.items():
        name, _, stack = k.partition("@")
        bare = runs.get("bare" + (f"@{stack}" if stack else ""))
        if name != "bare" and bare:
            results["added_p50_ms"][k] = v["sequential"]["p50_ms"] - bare["sequential"]["p50_ms"]
    for k, v in results["added_p50_ms"].items():
        print(f"added P50 over bare HTTP, {k}: {v:.2f} ms")
    results["target_1000_rps"] = {k: v["best_rps"] >= 1000 for k, v in runs.items()}
    for k in runs:
        name, _, stack = k.partition("@")
        if stack and name in runs:
            print(f"{name}: best req/s {runs[name]['best_rps']:.0f} (auto) vs {runs[k]['best_rps']:.0f} ({stack}): "
                  f"{runs[name]['best_rps'] / runs[k]['best_rps']:.2f}x")
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def run_setup(args, cmd, stack: str, wrk: str | None, lua: str | None) -> dict:
    port = free_port()
    quiet = wait_quiet()
    proc = start(cmd(port, stack), port)
    url = f"http://127.0.0.1:{port}/v1/completions"
    thr = []
    try:
        time.sleep(0.5)
        meter = CpuMeter(proc)
        seq = sequential(url, args.sequential)
        for c in args.concurrency:
            for attempt in range(1, args.attempts + 1):
                meter.begin()
                if wrk:
                    t = wrk_load(wrk, lua, url, c, args.duration, args.wrk_threads)
                else:
                    t = asyncio.run(httpx_load(url, c, args.duration))
                t["cpu"] = meter.end()
                t["attempt"] = attempt
                if t["cpu"].get("other_pct", 0.0) <= args.max_other_cpu:
                    break
                if attempt == args.attempts:
                    t["contended"] = True
                else:
                    wait_quiet()
            thr.append(t)
    finally:
        stop(proc)
    best = max(thr, key=lambda t: t["rps"])
    return {"stack": stack, "quiet_at_start": quiet, "sequential": seq, "throughput": thr,
            "best_rps": best["rps"], "best_concurrency": best["concurrency"]}


if __name__ == "__main__":
    sys.exit(main())
