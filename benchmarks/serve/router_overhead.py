"""Front-end + router overhead of `splitserve serve`, measured through HTTP with echo workers.

    python benchmarks/serve/router_overhead.py [--duration 5] [--concurrency 1 2 4 8 32] [--out results.json]

Echo workers (`--worker-mode echo`, a benchmark tool) return tokens without computing them, so
what is measured is the HTTP front end, request validation, the policy router, the signed
ZeroMQ hop to a worker process and back, and the response. Side by side, in one run:

- `bare`: a FastAPI app under the same uvicorn settings that returns a completion-shaped JSON
  body at once (no router, no worker): the floor that HTTP itself costs on this machine;
- `serve-baseline`: `splitserve serve --design baseline --mixed-workers 1 --worker-mode echo`;
- `serve-splitwise`: `splitserve serve --prompt-workers 1 --token-workers 1 --worker-mode echo`
  (prefill on one worker, a zero-layer KV "transfer", decode on the other).

For each: P50/P90/P99 latency of sequential requests (one at a time, so no queueing), and
requests/s with `--concurrency` requests in flight (a sweep; the best is reported) for
`--duration` seconds each (httpx, one client process). Added P50 = P50(serve) - P50(bare). Requests are short: a 3-token prompt, 2 tokens out.
The load client shares the machine's cores with the server and its workers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx

BODY = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0}

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
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
''')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    stop(proc)
    raise RuntimeError(f"{cmd} did not come up")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


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


async def throughput(url: str, concurrency: int, duration: float) -> dict:
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


def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": None, "python": platform.python_version(),
            "platform": platform.platform()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 32])
    ap.add_argument("--sequential", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    args = ap.parse_args()
    py = sys.executable
    setups = {
        "bare": lambda port: [py, "-c", BARE_APP, str(port)],
        "serve-baseline": lambda port: [py, "-m", "splitserve.cli", "serve", "--model", "tiny", "--port", str(port),
                                        "--design", "baseline", "--mixed-workers", "1", "--worker-mode", "echo",
                                        "--max-queue", "4096"],
        "serve-splitwise": lambda port: [py, "-m", "splitserve.cli", "serve", "--model", "tiny", "--port", str(port),
                                         "--prompt-workers", "1", "--token-workers", "1", "--worker-mode", "echo",
                                         "--max-queue", "4096"],
    }
    results: dict = {"machine": machine(), "request": BODY, "runs": {}}
    for name, cmd in setups.items():
        port = free_port()
        proc = start(cmd(port), port)
        url = f"http://127.0.0.1:{port}/v1/completions"
        try:
            seq = sequential(url, args.sequential)
            thr = [asyncio.run(throughput(url, c, args.duration)) for c in args.concurrency]
        finally:
            stop(proc)
        best = max(thr, key=lambda t: t["rps"])
        results["runs"][name] = {"sequential": seq, "throughput": thr, "best_rps": best["rps"],
                                 "best_concurrency": best["concurrency"]}
        sweep = ", ".join(f"{t['rps']:.0f}@{t['concurrency']}" for t in thr)
        print(f"{name:16s} sequential P50 {seq['p50_ms']:.2f} ms  P99 {seq['p99_ms']:.2f} ms;  "
              f"req/s@concurrency: {sweep}; errors {sum(t['errors'] for t in thr)}", flush=True)
    bare = results["runs"]["bare"]["sequential"]["p50_ms"]
    results["added_p50_ms"] = {k: v["sequential"]["p50_ms"] - bare for k, v in results["runs"].items() if k != "bare"}
    for k, v in results["added_p50_ms"].items():
        print(f"added P50 over bare HTTP, {k}: {v:.2f} ms")
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
