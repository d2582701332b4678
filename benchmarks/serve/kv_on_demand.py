"""KV reserved against KV on demand, live on this host's CPU (issue 41's "how fast").

    python benchmarks/serve/kv_on_demand.py load [--models tiny small] [--designs splitwise baseline]
        [--concurrency 48] [--duration 40] [--num-blocks 128] [--out benchmarks/serve/kv_on_demand.json]
    python benchmarks/serve/kv_on_demand.py steps [--out benchmarks/serve/kv_on_demand_steps.json]

`load`: for each model and design, `splitserve serve` with 128 KV blocks of 16 tokens per worker
under `--kv-allocation reserve` and then `on-demand` (same build, one after the other), each given
the same closed loop: `--concurrency` clients sending requests back to back for `--duration`
seconds. The requests leave `max_tokens` open as chat clients do and end at 32-128 output tokens
on a stop token: `tiny` by chat completions without `max_tokens`, `small` (no tokenizer) by
completions with `max_tokens` at the rest of the context. A random model has no natural end, so
each request samples with its own seed at temperature 1 (its tokens then depend only on the seed
and its logits) and stops at the first occurrence of a token chosen from a calibration run of the
same request (`stop_token_ids`), the one whose first occurrence is nearest a length drawn from
32-128. Reported per run: requests running at once (vLLM's `vllm:num_requests_running`, sampled
every 0.2 s: mean, median and most), completed requests and output tokens per second, output
lengths, preemptions, errors.

`steps`: the engine alone (no server), a decode step of B sequences at the same contexts under
both rules, alternating, median over repeats: what allocating on demand costs a step.

`offline` (scripts/gpu_check.sh runs it on a GPU: llama3-8b bf16, 200 requests): the engine alone
with its default KV cache (90% of free GPU memory), every request added at once with ShareGPT-like
lengths (lognormal, means about 160 prompt and 340 output tokens, clipped to 4-1024) and
`max_tokens` at the rest of the context, each stopped at its length (aborted, as a stop token
would end it); under both rules: output tokens/s, requests running per step, preemptions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import free_port  # noqa: E402

LOW, HIGH = 32, 128   # output lengths the stop tokens aim at


def start(model: str, design: str, alloc: str, blocks: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    workers = ["--prompt-workers", "1", "--token-workers", "1"] if design == "splitwise" else \
        ["--design", "baseline", "--mixed-workers", "2"]
    proc = subprocess.Popen([sys.executable, "-m", "splitserve.cli", "serve", "--model", model, "--port", str(port),
                             "--num-blocks", str(blocks), "--kv-allocation", alloc, "--log-stats-interval", "0",
                             *workers], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.terminate()
    raise SystemExit("serve did not come up")


def requests(model: str, n: int) -> list[dict]:
    """`n` requests (seeded): chat messages for tiny, token-id prompts for small."""
    rng = random.Random(41)
    out = []
    for i in range(n):
        if model == "tiny":
            words = " ".join(f"w{rng.randrange(100)}" for _ in range(rng.randint(6, 20)))
            out.append({"messages": [{"role": "user", "content": words}], "seed": i})
        else:
            out.append({"prompt": [rng.randrange(3, 32000) for _ in range(rng.randint(32, 256))], "seed": i})
    return out


def prompt_ids(client: httpx.Client, url: str, model: str, req: dict) -> list[int]:
    if "prompt" in req:
        return req["prompt"]
    return client.post(url + "/tokenize", json={"model": model, "messages": req["messages"]}).json()["tokens"]


def calibrate(url: str, model: str, reqs: list[dict]) -> list[dict]:
    """Each request with its stop token: from its own run to 128 tokens (16 at a time: a seeded
    request's tokens do not depend on its batch), the token whose first occurrence makes the output
    nearest a length drawn from 32-128, before any EOS (requests with none dropped)."""
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(7)
    targets = [rng.randint(LOW, HIGH) for _ in reqs]
    with httpx.Client(timeout=600) as c:
        def run(req: dict) -> list[int]:
            body = {"model": model, "prompt": prompt_ids(c, url, model, req), "max_tokens": HIGH,
                    "temperature": 1.0, "seed": req["seed"]}
            return c.post(url + "/v1/completions", json=body).json()["choices"][0]["token_ids"]  # to EOS or 128
        with ThreadPoolExecutor(16) as pool:
            runs = list(pool.map(run, reqs))
    out = []
    for req, toks, target in zip(reqs, runs, targets):
        first: dict[int, int] = {}
        for k, t in enumerate(toks):
            first.setdefault(t, k + 1)  # the output's length if it stops at t
        fits = [(abs(n - target), n, t) for t, n in first.items() if LOW <= n <= HIGH]
        if fits:
            _, n, t = min(fits)
            out.append({**req, "stop_token_ids": [t], "expect": n})
    return out


def running_now(text: str) -> tuple[float, float]:
    get = lambda name: sum(float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} ([0-9.e+-]+)", text, re.M))  # noqa: E731
    return get("vllm:num_requests_running"), get("vllm:num_preemptions_total")


async def closed_loop(url: str, model: str, reqs: list[dict], concurrency: int, duration: float) -> dict:
    chat = model == "tiny"
    done: list[tuple[float, int]] = []
    errors = 0
    running: list[float] = []
    stop = asyncio.Event()
    nxt = iter(range(10**9))

    async def client(c: httpx.AsyncClient):
        nonlocal errors
        while not stop.is_set():
            r = reqs[next(nxt) % len(reqs)]
            body = {"model": model, "temperature": 1.0, "seed": r["seed"], "stop_token_ids": r["stop_token_ids"]}
            if chat:
                body["messages"] = r["messages"]            # no max_tokens: the rest of the context
            else:
                body |= {"prompt": r["prompt"], "max_tokens": r["room"]}
            try:
                resp = await c.post(url + ("/v1/chat/completions" if chat else "/v1/completions"), json=body)
                if resp.status_code != 200:
                    errors += 1
                    continue
                done.append((time.monotonic(), resp.json()["usage"]["completion_tokens"]))
            except httpx.HTTPError:
                errors += 1

    async def poll(c: httpx.AsyncClient):
        while not stop.is_set():
            running.append(running_now((await c.get(url + "/metrics")).text)[0])
            await asyncio.sleep(0.2)

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=concurrency + 4)) as c:
        pre = running_now((await c.get(url + "/metrics")).text)[1]
        t0 = time.monotonic()
        tasks = [asyncio.create_task(client(c)) for _ in range(concurrency)] + [asyncio.create_task(poll(c))]
        await asyncio.sleep(duration)
        stop.set()
        t1 = time.monotonic()
        await asyncio.gather(*tasks)
        post = running_now((await c.get(url + "/metrics")).text)[1]
    warm = t0 + duration * 0.2       # the first fifth warms up
    window = [(t, n) for t, n in done if warm <= t <= t1]
    span = t1 - warm
    steady = running[len(running) // 5:]
    lens = [n for _, n in done]
    return {"completed_rps": len(window) / span, "output_tok_s": sum(n for _, n in window) / span,
            "running_mean": statistics.fmean(steady), "running_median": statistics.median(steady),
            "running_max": max(steady), "completed": len(done), "errors": errors, "preemptions": post - pre,
            "output_len_mean": statistics.fmean(lens) if lens else 0.0,
            "output_len_range": [min(lens), max(lens)] if lens else None}


def load(args) -> dict:
    results = []
    for model in args.models:
        base = requests(model, args.requests)
        calibrated = None
        for design in args.designs:
            for alloc in args.allocs:
                proc, url = start(model, design, alloc, args.num_blocks)
                try:
                    if calibrated is None:   # once per model: the same requests and stops for every run
                        calibrated = calibrate(url, model, base)
                        ctx = httpx.get(url + "/v1/models").json()["data"][0]["max_model_len"]
                        ctx = min(ctx, args.num_blocks * 16)   # what a worker can hold (the router's limit)
                        for r in calibrated:
                            r["room"] = ctx - len(r.get("prompt", ()))
                    row = asyncio.run(closed_loop(url, model, calibrated, args.concurrency, args.duration))
                finally:
                    proc.terminate()
                    proc.wait()
                    time.sleep(1)
                row |= {"model": model, "design": design, "kv_allocation": alloc, "requests": len(calibrated)}
                print(json.dumps(row), flush=True)
                results.append(row)
    return {"runs": results}


def steps(args) -> dict:
    import torch

    from splitserve.engine.engine import EngineConfig, LLMEngine
    from splitserve.engine.sampler import SamplingParams
    from splitserve.policy.machine import BatchingConfig

    torch.set_num_threads(1)
    out = {}
    for model, batch, ctx in (("tiny", 32, 200), ("small", 16, 200)):
        engines = {a: LLMEngine(model, EngineConfig(num_blocks=2048, batching=BatchingConfig(kv_allocation=a),
                                                    prefix_caching=False))
                   for a in ("reserve", "on-demand")}   # room for every sequence's whole length: the same batch
        rng = random.Random(3)
        prompts = [[rng.randrange(3, 250) for _ in range(ctx)] for _ in range(batch)]
        for e in engines.values():
            for i, p in enumerate(prompts):
                e.add_request(p, SamplingParams(max_tokens=400, ignore_eos=True), str(i))
            while len(e.scheduler.m.running) < batch:  # the prefills (2048 tokens a step)
                e.step()
        times: dict[str, list[float]] = {a: [] for a in engines}
        for _ in range(args.repeats):
            for a, e in engines.items():               # alternating: the same contexts, a step each
                t = time.perf_counter()
                e.step()
                times[a].append(time.perf_counter() - t)
        med = {a: statistics.median(v) for a, v in times.items()}
        out[model] = {"batch": batch, "context_from": ctx, "steps": args.repeats,
                      "median_ms": {a: v * 1e3 for a, v in med.items()},
                      "on_demand_over_reserve": med["on-demand"] / med["reserve"]}
        print(model, json.dumps(out[model]), flush=True)
    return out


def offline(args) -> dict:
    import math

    import torch

    from splitserve.engine.engine import EngineConfig, LLMEngine
    from splitserve.engine.sampler import SamplingParams
    from splitserve.policy.machine import BatchingConfig

    rng = random.Random(5)
    draw = lambda mu: max(4, min(1024, round(math.exp(rng.gauss(mu, 0.9)))))  # noqa: E731
    sizes = [(draw(4.6), draw(5.4)) for _ in range(args.requests)]   # lognormal: means about 160 and 340 tokens
    out = {"model": args.model, "device": args.device, "requests": args.requests,
           "mean_prompt": statistics.fmean(p for p, _ in sizes), "mean_output": statistics.fmean(o for _, o in sizes)}
    for alloc in ("reserve", "on-demand"):
        eng = LLMEngine(args.model, EngineConfig(device=args.device, dtype=args.dtype, num_blocks=args.num_blocks,
                                                 max_num_seqs=args.requests,
                                                 batching=BatchingConfig(kv_allocation=alloc), prefix_caching=False))
        ctx = eng.max_seq_len
        want = {}
        for i, (p, o) in enumerate(sizes):
            p = min(p, ctx // 2)
            rid = eng.add_request([rng.randrange(3, min(1000, eng.cfg.vocab_size)) for _ in range(p)],
                                  SamplingParams(max_tokens=ctx - p, ignore_eos=True), str(i))
            want[rid] = min(o, ctx - p)
        made, running, steps = 0, [], 0
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        while eng.has_unfinished():
            for o in eng.step():
                made += len(o.new_token_ids)
                if not o.finished and len(o.token_ids) >= want[o.request_id]:
                    eng.abort(o.request_id)          # its stop token
            running.append(len(eng.scheduler.m.running))
            steps += 1
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        out[alloc] = {"output_tok_s": made / wall, "wall_s": wall, "steps": steps,
                      "running_mean": statistics.fmean(running), "running_max": max(running),
                      "preemptions": eng.scheduler.num_preemptions, "kv_blocks": eng.blocks.num_blocks}
        print(alloc, json.dumps(out[alloc]), flush=True)
        del eng
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    out["on_demand_over_reserve_tok_s"] = out["on-demand"]["output_tok_s"] / out["reserve"]["output_tok_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("load")
    lp.add_argument("--models", nargs="+", default=["tiny", "small"])
    lp.add_argument("--designs", nargs="+", default=["splitwise", "baseline"])
    lp.add_argument("--allocs", nargs="+", default=["reserve", "on-demand"])
    lp.add_argument("--concurrency", type=int, default=48)
    lp.add_argument("--duration", type=float, default=40.0)
    lp.add_argument("--requests", type=int, default=160)
    lp.add_argument("--num-blocks", type=int, default=128)
    lp.add_argument("--out", default="benchmarks/serve/kv_on_demand.json")
    sp = sub.add_parser("steps")
    sp.add_argument("--repeats", type=int, default=150)
    sp.add_argument("--out", default="benchmarks/serve/kv_on_demand_steps.json")
    op = sub.add_parser("offline")
    op.add_argument("--model", default="tiny")
    op.add_argument("--device", default="cpu")
    op.add_argument("--dtype", default="auto")
    op.add_argument("--requests", type=int, default=200)
    op.add_argument("--num-blocks", type=int, default=None, help="default: the engine's (90%% of free GPU memory)")
    op.add_argument("--out", default="benchmarks/serve/kv_on_demand_offline.json")
    args = ap.parse_args()
    res = {"load": load, "steps": steps, "offline": offline}[args.cmd](args)
    res["machine"] = {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                      "load_avg_at_end": Path("/proc/loadavg").read_text().split()[:3],
                      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
