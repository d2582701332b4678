"""Offline throughput: `--requests` requests of ShareGPT-like lengths, all added at once, run to the
end by the engine alone (no server), with the Triton kernels and with the torch ones (issue 46
item 4).

    python benchmarks/engine/bench_throughput.py                 # CUDA: llama3-8b bf16, 512 requests
    python benchmarks/engine/bench_throughput.py --device cpu --model tiny --requests 24 --kernels torch

Lengths: lognormal, means about 160 prompt and 340 output tokens, clipped to 4-1024 (the same
draw as benchmarks/serve/kv_on_demand.py's `offline`, seed 5); each request stops at its length
(ignore_eos, max_tokens), so every run makes the same tokens (both clipped to a small model's
context: `tiny` has 512 positions). KV on demand (the live system's
rule), at most `--max-num-seqs` running, CUDA graphs on CUDA (every bucket captured before the
clock starts), the default KV cache (90% of free GPU memory). Reported per kernel choice: output tokens/s and all tokens (prompt + output)/s over
the wall time from the first step to the last, steps, mean running batch, preemptions. The
result file is rewritten after each run. Writes results/throughput-<device>-<model>-<dtype>.json.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import engine_parser, machine_info, sync, write_result  # noqa: E402

from splitserve.engine.engine import EngineConfig, LLMEngine  # noqa: E402
from splitserve.engine.sampler import SamplingParams  # noqa: E402
from splitserve.errors import UserError  # noqa: E402
from splitserve.policy.machine import BatchingConfig  # noqa: E402


def sharegpt_like(n: int, seed: int = 5) -> list[tuple[int, int]]:
    """(prompt, output) lengths: lognormal (means about 160 and 340), clipped to 4-1024."""
    rng = random.Random(seed)
    draw = lambda mu: max(4, min(1024, round(math.exp(rng.gauss(mu, 0.9)))))  # noqa: E731
    return [(draw(4.6), draw(5.4)) for _ in range(n)]


def run(args, kernels: str, sizes: list[tuple[int, int]]) -> dict:
    device = torch.device(args.device)
    eng = LLMEngine(args.model, EngineConfig(
        device=device, dtype=args.dtype, num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
        max_model_len=2048, batching=BatchingConfig(kv_allocation="on-demand"), prefix_caching=False,
        cuda_graphs=device.type == "cuda", kernels=kernels))
    rng = random.Random(7)
    ctx = eng.max_seq_len
    sizes = [(min(p, ctx // 2), min(o, ctx - min(p, ctx // 2))) for p, o in sizes]  # a small model's context
    for i, (p, o) in enumerate(sizes):
        eng.add_request([rng.randrange(3, min(30000, eng.cfg.vocab_size)) for _ in range(p)],
                        SamplingParams(max_tokens=o, ignore_eos=True), str(i))
    made, running, steps = 0, [], 0
    if eng.graphs is not None:  # as vLLM and nano-vllm do at start-up: no capture inside the clock
        eng.graphs.capture_all()
    sync(device)
    t0 = time.perf_counter()
    while eng.has_unfinished():
        for out in eng.step():
            made += len(out.new_token_ids)
        running.append(len(eng.scheduler.m.running))
        steps += 1
    sync(device)
    wall = time.perf_counter() - t0
    prompt = sum(p for p, _ in sizes)
    row = {"kernels": kernels, "triton": eng.model.kernels is not None, "wall_s": wall, "output_tokens": made,
           "prompt_tokens": prompt,
           "output_tok_s": made / wall, "total_tok_s": (made + prompt) / wall, "steps": steps,
           "running_mean": statistics.fmean(running), "running_max": max(running),
           "preemptions": eng.scheduler.num_preemptions, "kv_blocks": eng.blocks.num_blocks,
           "cuda_graphs": 0 if eng.graphs is None else len(eng.graphs.graphs)}
    print(f"{kernels:6s}: {row['output_tok_s']:.0f} output tok/s, {row['total_tok_s']:.0f} tok/s in all, "
          f"{wall:.1f} s, {steps} steps, running {row['running_mean']:.1f}", flush=True)
    del eng
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> dict:
    cuda = torch.cuda.is_available()
    ap = engine_parser(__doc__, cpu_model="tiny")
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--max-num-seqs", type=int, default=256, help="running at most (vLLM's default)")
    ap.add_argument("--num-blocks", type=int, default=None, help="default: the engine's")
    ap.add_argument("--kernels", default="triton,torch" if cuda else "torch", help="engine/kernels.py choices")
    ap.add_argument("--name", default=None, help="result file name (without .json)")
    args = ap.parse_args(argv)
    sizes = sharegpt_like(args.requests)
    dtype = args.dtype
    name = args.name or f"throughput-{torch.device(args.device).type}-{args.model}-{dtype}"
    result = {"benchmark": "throughput", "model": args.model, "dtype": dtype, "requests": args.requests,
              "max_num_seqs": args.max_num_seqs, "mean_prompt": statistics.fmean(p for p, _ in sizes),
              "mean_output": statistics.fmean(o for _, o in sizes),
              "machine": machine_info(torch.device(args.device)), "runs": []}
    for kernels in args.kernels.split(","):
        try:
            result["runs"].append(run(args, kernels, sizes))
        except UserError as e:  # triton missing here: say so, run the rest
            result["runs"].append({"kernels": kernels, "error": str(e)})
            print(f"{kernels}: {e}", flush=True)
        write_result(name, result)
    print(f"wrote {name}.json")
    return result


if __name__ == "__main__":
    main()
