"""Serve's decode step against the engine's own (issue 26 item 6): TPOT P50 of `splitserve serve`
(1 prompt + 1 token worker, split) at low load, over the step time of an in-process LLMEngine
decoding the same batch at the same context length.

    python benchmarks/serve/tpot_vs_step.py                                   # CPU: small, 4 streams
    python benchmarks/serve/tpot_vs_step.py --device cuda --model llama3-8b --dtype bfloat16 \
        --cuda-graphs --num-blocks 4096 --out benchmarks/serve/tpot_vs_step_gpu.json

Serve: `--streams` requests at once (same prompt length, `--output-tokens` each, ignore_eos),
streamed over HTTP; `--rounds` rounds of them. TPOT of a request = (end - first token) /
(tokens - 1), as `splitserve bench` counts it; the figure is the P50 over all requests. The
token worker's own step times come from `serve --step-log` (steps with `--streams` decodes), so
the gap splits into the worker's step (engine + worker loop) and what the router/HTTP adds.
Engine: the same model, dtype, device and threads (`--worker-threads`), `--streams` requests
prefilled, then decode steps timed at the mean context of the served decodes, once before serve
and once after (their mean is the step; both are kept: on a shared machine the load drifts).
Target: ratio <= 1.15. Writes `--out` (JSON, with the machine and the load average).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "engine"))
from common import timed  # noqa: E402  (benchmarks/engine/common.py)
from live import TICK, children, exit_on_sigterm, free_port, header, running, serve_cmd  # noqa: E402


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used (Linux /proc; 0 elsewhere)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(f[11]) + int(f[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


async def one_stream(client: httpx.AsyncClient, url: str, prompt: list[int], n: int, model: str) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": n, "ignore_eos": True, "stream": True,
            "temperature": 0.0, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    tokens = 0
    async with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            usage = chunk.get("usage")
            if usage:
                tokens = usage.get("completion_tokens", tokens)
            if chunk.get("choices") and first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    tpot = (end - first) / (tokens - 1) if first is not None and tokens > 1 else None
    return {"ttft_s": None if first is None else first - t0, "e2e_s": end - t0, "tokens": tokens, "tpot_s": tpot}


async def rounds(base: str, streams: int, prompt_len: int, out_tokens: int, n_rounds: int, vocab: int) -> list[dict]:
    url = f"{base}/v1/completions"
    recs = []
    async with httpx.AsyncClient(timeout=300) as client:
        model = (await client.get(f"{base}/v1/models")).json()["data"][0]["id"]
        await one_stream(client, url, list(range(3, 3 + prompt_len)), 4, model)  # warm-up
        for r in range(n_rounds):
            prompts = [[3 + (7 * i + 13 * j + r) % (vocab - 3) for j in range(prompt_len)] for i in range(streams)]
            recs += await asyncio.gather(*(one_stream(client, url, p, out_tokens, model) for p in prompts))
    return recs


def served(args, step_dir: Path) -> dict:
    port = free_port()
    cmd = serve_cmd("--model", args.model, "--device", args.device, "--dtype", args.dtype,
                    "--prompt-workers", "1", "--token-workers", "1", "--transport", args.transport,
                    "--worker-threads", str(args.worker_threads), "--port", str(port),
                    "--step-log", str(step_dir), *(["--cuda-graphs"] if args.cuda_graphs else []),
                    "--max-num-seqs", str(args.max_num_seqs),
                    *(["--num-blocks", str(args.num_blocks)] if args.num_blocks else []))
    log = step_dir / "serve.log"
    if args.profile_dir:  # worker.py: cProfile of each worker's loop, PREFIX.<id>.prof
        args.profile_dir.mkdir(parents=True, exist_ok=True)
        os.environ["SPLITSERVE_WORKER_PROFILE"] = str(args.profile_dir.resolve() / "worker")
    with running(cmd, port, timeout=args.start_timeout, log=log) as proc:
        pids = {"router": proc.pid, **{f"worker_{i}": p for i, p in enumerate(sorted(children(proc.pid)))}}
        cpu0, client0 = {k: cpu_s(p) for k, p in pids.items()}, time.process_time()
        recs = asyncio.run(rounds(f"http://127.0.0.1:{port}", args.streams, args.prompt_len, args.output_tokens,
                                  args.rounds, args.vocab))
        cpu = {k: cpu_s(p) - cpu0[k] for k, p in pids.items()}
        cpu["client"] = time.process_time() - client0
    tpots = [r["tpot_s"] for r in recs if r["tpot_s"] is not None]
    # the token worker's steps with exactly `streams` decodes (shape: one entry per sequence)
    steps = []
    for f in step_dir.glob("worker-*.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            seqs = rec.get("seqs") or []
            if len(seqs) == args.streams and all(_decode(s) for s in seqs):
                steps.append(rec["s"])
    tokens = sum(r["tokens"] for r in recs)
    return {"command": " ".join(cmd), "requests": len(recs), "tokens": tokens,
            # CPU each process spent per generated token over the rounds (load-independent: what
            # serve costs on top of the engine, which a shared machine turns into waiting)
            "cpu_ms_per_token": {k: round(1e3 * v / max(tokens, 1), 3) for k, v in cpu.items()},
            "tpot_p50_ms": 1e3 * statistics.median(tpots) if tpots else None,
            "tpot_p90_ms": 1e3 * statistics.quantiles(tpots, n=10)[-1] if len(tpots) >= 2 else None,
            "ttft_p50_ms": 1e3 * statistics.median([r["ttft_s"] for r in recs if r["ttft_s"] is not None]),
            "worker_decode_steps": len(steps),
            "worker_step_p50_ms": 1e3 * statistics.median(steps) if steps else None}


def _decode(seq) -> bool:
    """A step-log sequence entry (KV tokens before, tokens this step) that decodes one token."""
    return isinstance(seq, (list, tuple)) and len(seq) == 2 and seq[1] == 1


def engine_step(args) -> dict:
    import torch

    from splitserve.engine.engine import EngineConfig, LLMEngine
    from splitserve.engine.sampler import SamplingParams

    torch.set_num_threads(args.worker_threads)
    ctx = args.prompt_len + args.output_tokens // 2  # mean context of the served decodes
    total = ctx + args.steps + 8
    # configured as serve's workers are (the same CUDA graph buckets and KV cache size)
    eng = LLMEngine(args.model, EngineConfig(device=args.device, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
                                             num_blocks=args.num_blocks, cuda_graphs=args.cuda_graphs,
                                             prefix_caching=False))  # steps measure whole prompts
    gen = torch.Generator().manual_seed(0)
    for _ in range(args.streams):
        eng.add_request(torch.randint(3, eng.cfg.vocab_size, (args.prompt_len,), generator=gen).tolist(),
                        SamplingParams(max_tokens=total - args.prompt_len, ignore_eos=True, temperature=0.0))
    while eng.scheduler.waiting or any(s.num_computed < len(s.prompt_ids) for s in eng.scheduler.running):
        eng.step()
    for _ in range(ctx - args.prompt_len - args.steps // 2):  # to the mean served context
        eng.step()
    cuda = torch.device(args.device).type == "cuda"
    cpu0 = time.process_time()
    times = timed(eng.step, torch.device(args.device), args.steps)
    cpu = time.process_time() - cpu0
    del eng
    if cuda:  # give the memory back before serve's workers want it
        import gc
        gc.collect()
        torch.cuda.empty_cache()
    return {"context_mid": ctx, "steps": len(times), "step_p50_ms": 1e3 * statistics.median(times),
            "step_min_ms": 1e3 * min(times), "cpu_ms_per_step": 1e3 * cpu / len(times), "cuda_graphs": args.cuda_graphs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--transport", default="local")
    ap.add_argument("--cuda-graphs", action="store_true")
    ap.add_argument("--num-blocks", type=int, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=16, help="serve --max-num-seqs (CUDA graph buckets)")
    ap.add_argument("--worker-threads", type=int, default=1)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=48, help="engine steps timed")
    ap.add_argument("--vocab", type=int, default=250, help="prompt ids drawn below this")
    ap.add_argument("--start-timeout", type=float, default=180.0)
    ap.add_argument("--target", type=float, default=1.15)
    ap.add_argument("--profile-dir", type=Path, default=None,
                    help="cProfile each worker's loop into DIR/worker.<id>.prof (slows it: not for the ratio)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when the ratio misses the target")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "tpot_vs_step.json")
    args = ap.parse_args(argv)
    exit_on_sigterm()  # a `timeout` stops the server too

    t0 = time.perf_counter()
    result = header("tpot_vs_step")
    result["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result["load_average_1m"] = {"start": round(os.getloadavg()[0], 2)}
    before = engine_step(args)  # the engine before and after serve: a busy shared machine drifts
    with tempfile.TemporaryDirectory(prefix="tpot_vs_step-") as d:
        result["serve"] = served(args, Path(d))
    after = engine_step(args)
    result["load_average_1m"]["end"] = round(os.getloadavg()[0], 2)
    e = result["engine"] = {**after, "step_p50_ms": (before["step_p50_ms"] + after["step_p50_ms"]) / 2,
                            "step_p50_ms_before": before["step_p50_ms"], "step_p50_ms_after": after["step_p50_ms"],
                            "cpu_ms_per_step_before": before["cpu_ms_per_step"]}
    s = result["serve"]
    result["ratio_tpot_to_step"] = s["tpot_p50_ms"] / e["step_p50_ms"] if s["tpot_p50_ms"] else None
    result["ratio_worker_step_to_step"] = (s["worker_step_p50_ms"] / e["step_p50_ms"]
                                           if s["worker_step_p50_ms"] else None)
    result["ratio_tpot_to_worker_step"] = (s["tpot_p50_ms"] / s["worker_step_p50_ms"]
                                           if s["tpot_p50_ms"] and s["worker_step_p50_ms"] else None)
    # load-independent: CPU per token of the token worker (the busiest worker) over the engine's
    workers = [v for k, v in s["cpu_ms_per_token"].items() if k.startswith("worker_")]
    engine_cpu = (e["cpu_ms_per_step_before"] + e["cpu_ms_per_step"]) / 2 / args.streams
    result["ratio_token_worker_cpu_to_engine_cpu"] = max(workers) / engine_cpu if workers and engine_cpu else None
    result["target"] = args.target
    result["meets_target"] = bool(result["ratio_tpot_to_step"] and result["ratio_tpot_to_step"] <= args.target)
    result["wall_s"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"serve TPOT P50 {s['tpot_p50_ms']:.2f} ms (worker step P50 {s['worker_step_p50_ms'] or float('nan'):.2f} ms, "
          f"{s['worker_decode_steps']} steps), engine step P50 {e['step_p50_ms']:.2f} ms at context "
          f"{e['context_mid']}: ratio {result['ratio_tpot_to_step']:.3f} (target <= {args.target}); CPU per token: "
          f"token worker / engine {result['ratio_token_worker_cpu_to_engine_cpu'] or float('nan'):.3f}, router "
          f"{s['cpu_ms_per_token'].get('router', float('nan')):.3f} ms; load {result['load_average_1m']}; wrote {args.out}")
    return 1 if args.strict and not result["meets_target"] else 0


if __name__ == "__main__":
    sys.exit(main())
