"""Decode steps at serving batch sizes and long contexts, each with the Triton kernels and with the
torch ones (issue 46 item 4), against the bound of the bytes a step must read.

    python benchmarks/engine/bench_batches.py            # CUDA: llama3-8b bf16, CUDA graphs
    python benchmarks/engine/bench_batches.py --device cpu --model tiny --grid 1x32,4x48 --kernels torch

For each BxC of `--grid` (in its order): B requests of a C-token prompt are prefilled, then for
each of `--kernels` the model is switched to those kernels (new CUDA graphs captured for them) and
`--steps` decode steps of the whole engine are timed after `--warmup`. The bound of a step is
(weights read + B x mean context x KV bytes per token) / bandwidth (datasheet, and a measured
on-device copy). The result file is rewritten after every configuration, so a run stopped by a
time limit keeps what it measured. Writes results/batches-<device>-<model>-<dtype>.json (or --name).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import (engine_parser, add_threads_arg, apply_threads, gpu_datasheet, machine_info,  # noqa: E402
                    measured_bandwidth, summary, timed, write_result)

from splitserve.engine.engine import EngineConfig, LLMEngine  # noqa: E402
from splitserve.errors import UserError  # noqa: E402
from splitserve.engine.kernels import select_kernels  # noqa: E402
from splitserve.engine.sampler import SamplingParams  # noqa: E402
from splitserve.policy.machine import BatchingConfig  # noqa: E402

CUDA_GRID = "64x1024,1x512,1x4096,16x1024,16x4096,256x512,64x4096,256x1024"  # the target first


def parse_grid(text: str) -> list[tuple[int, int]]:
    return [(int(b), int(c)) for b, c in (x.split("x") for x in text.split(","))]


def use_kernels(eng: LLMEngine, name: str) -> None:
    """Switch the engine's model to `name`'s kernels; CUDA graphs captured anew for them."""
    eng.model.use_kernels(select_kernels(name, eng.device))
    if eng.graphs is not None:
        from splitserve.engine.cuda_graph import DecodeGraphs

        old = eng.graphs
        eng.graphs = None
        del old
        torch.cuda.empty_cache()
        eng.graphs = DecodeGraphs(eng.model, eng.kv, eng.config.max_num_seqs, eng.blocks.blocks_for(eng.max_seq_len))


def prefill(eng: LLMEngine, batch: int, context: int, max_tokens: int, gen: torch.Generator) -> list[str]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    ids = [eng.add_request(torch.randint(3, eng.cfg.vocab_size, (context,), generator=gen).tolist(), params)
           for _ in range(batch)]
    while any(s.num_computed < len(s.prompt_ids) for s in eng.scheduler.running) or eng.scheduler.waiting:
        eng.step()
    return ids


def measure(eng: LLMEngine, args, batch: int, context: int, bytes_fixed: float, bws: dict) -> list[dict]:
    rows: list[dict] = []
    for name in args.kernels.split(","):
        try:
            use_kernels(eng, name)
        except UserError as e:  # triton missing here: say so, measure the rest
            rows.append({"batch": batch, "context": context, "kernels": name, "error": str(e)})
            print(f"B={batch:4d} ctx={context:5d} {name:6s}: {e}", flush=True)
            continue
        for _ in range(args.warmup):
            eng.step()
        times = timed(eng.step, eng.device, args.steps)
        s = summary(times)
        done = sum("error" not in r for r in rows)
        ctx = context + done * (args.warmup + args.steps) + args.warmup + args.steps // 2  # mean during timing
        step_bytes = bytes_fixed + batch * ctx * eng.cfg.kv_bytes_per_token(eng.dtype.itemsize)
        row = {"batch": batch, "context": context, "kernels": name, "triton": eng.model.kernels is not None, **s,
               "tokens_per_s": batch / (s["median_ms"] / 1e3), "bytes_per_step": step_bytes}
        for key, bw in bws.items():
            if bw:
                row[f"bound_ms_{key}"] = 1e3 * step_bytes / bw
                row[f"ratio_to_{key}_bound"] = s["median_ms"] / row[f"bound_ms_{key}"]
        rows.append(row)
        print(f"B={batch:4d} ctx={context:5d} {name:6s}: {s['median_ms']:8.3f} ms/step  "
              f"{row['tokens_per_s']:9.0f} tok/s  bound {row.get('bound_ms_datasheet', row['bound_ms_measured']):.3f} ms "
              f"x{row.get('ratio_to_datasheet_bound', row['ratio_to_measured_bound']):.2f}", flush=True)
    return rows


def build(args, grid: list[tuple[int, int]]) -> LLMEngine:
    device = torch.device(args.device)
    kernels_steps = len(args.kernels.split(",")) * (args.warmup + args.steps)
    total = max(c for _, c in grid) + kernels_steps + 2
    blocks = max(b * -(-(c + kernels_steps + 2) // 16) for b, c in grid) + 1
    return LLMEngine(args.model, EngineConfig(
        device=device, dtype=args.dtype, max_num_seqs=max(b for b, _ in grid), max_model_len=total,
        num_blocks=blocks, batching=BatchingConfig(prompt_token_cap=max(8192, max(c for _, c in grid))),
        cuda_graphs=device.type == "cuda", prefix_caching=False, kernels="torch"))


def main(argv: list[str] | None = None) -> dict:
    cuda = torch.cuda.is_available()
    ap = engine_parser(__doc__)
    ap.add_argument("--grid", default=CUDA_GRID if cuda else "1x64,4x128", help="BATCHxCONTEXT,...")
    ap.add_argument("--kernels", default="triton,torch" if cuda else "torch", help="engine/kernels.py choices")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--name", default=None, help="result file name (without .json)")
    add_threads_arg(ap)
    args = ap.parse_args(argv)
    apply_threads(args.threads)
    grid = parse_grid(args.grid)
    eng = build(args, grid)
    cfg, device = eng.cfg, eng.device
    # Weights a decode step reads: all but the input embedding table (only B rows of it are read).
    weights = (cfg.num_params() - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)) * eng.dtype.itemsize
    bws = {"measured": measured_bandwidth(device), "datasheet": gpu_datasheet(device)[1] if cuda else None}
    name = args.name or f"batches-{device.type}-{args.model}-{str(eng.dtype).removeprefix('torch.')}"
    result = {"benchmark": "batches", "model": args.model, "dtype": str(eng.dtype).removeprefix("torch."),
              "cuda_graphs": eng.graphs is not None, "weight_bytes_per_step": weights,
              "bandwidth_measured_Bps": bws["measured"], "bandwidth_datasheet_Bps": bws["datasheet"],
              "steps": args.steps, "machine": machine_info(device), "results": []}
    gen = torch.Generator().manual_seed(0)
    for batch, context in grid:
        ids = prefill(eng, batch, context, eng.max_seq_len - context, gen)
        result["results"] += measure(eng, args, batch, context, weights, bws)
        for rid in ids:
            eng.abort(rid)
        eng.step()  # the aborts take effect
        write_result(name, result)
    print(f"wrote {name}.json")
    return result


if __name__ == "__main__":
    main()
