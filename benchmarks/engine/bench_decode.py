"""Decode-step time and throughput of the engine, against the memory-bandwidth bound.

    python benchmarks/engine/bench_decode.py                      # CUDA: llama3-8b bf16, batch 1..256, graphs
    python benchmarks/engine/bench_decode.py --device cpu --model small --batch-sizes 1,4,16,64

For each batch size B: B requests with a `--context`-token prompt are prefilled, then `--steps`
decode steps of the whole engine (scheduling, input preparation, model, sampling) are timed.
The bound of a step is (bytes of weights read + bytes of KV read) / memory bandwidth, with the
bandwidth from the GPU's datasheet (and, always, from a measured on-device copy).
Writes results/decode-<device>-<model>-<dtype>.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import (engine_parser, add_threads_arg, apply_threads, gpu_datasheet, machine_info,  # noqa: E402
                    measured_bandwidth, summary, sync, timed, write_result)

from splitserve.engine.engine import EngineConfig, LLMEngine  # noqa: E402
from splitserve.policy.machine import BatchingConfig  # noqa: E402
from splitserve.engine.sampler import SamplingParams  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    cuda = torch.cuda.is_available()
    ap = engine_parser(__doc__)
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128,256" if cuda else "1,4,16,64")
    ap.add_argument("--context", type=int, default=128, help="prompt tokens per request")
    ap.add_argument("--steps", type=int, default=32 if cuda else 16)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--name", default=None, help="result file name (without .json)")
    ap.add_argument("--tp", type=int, default=1, help="tensor parallel ranks (gloo on CPU: one process each)")
    ap.add_argument("--compile-layers", action="store_true",
                    help="experiment: torch.compile each decoder layer (fuses the ~50 small kernels of a "
                         "layer's norms, rotary and residuals) before the CUDA graphs are captured")
    add_threads_arg(ap)
    args = ap.parse_args(argv)
    apply_threads(args.threads)

    device = torch.device(args.device)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    graphs = device.type == "cuda" and not args.no_cuda_graphs
    total = args.context + args.warmup + args.steps + 2
    eng = LLMEngine(args.model, EngineConfig(device=device, dtype=args.dtype, tp=args.tp, max_num_seqs=max(batches),
                                             max_model_len=total, num_blocks=max(batches) * -(-total // 16) + 1,
                                             batching=BatchingConfig(prompt_token_cap=max(2048, args.context)),
                                             cuda_graphs=graphs, prefix_caching=False))
    if args.compile_layers:
        for layer in eng.model.layers:
            layer.compile()
    cfg = eng.cfg
    itemsize = eng.dtype.itemsize
    # Weights a decode step reads: all but the input embedding table (only B rows of it are read).
    weight_bytes = (cfg.num_params() - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)) * itemsize
    bw_measured = measured_bandwidth(device)
    bw_sheet = gpu_datasheet(device)[1] if device.type == "cuda" else None
    gen = torch.Generator().manual_seed(0)

    rows = []
    for b in batches:
        params = SamplingParams(max_tokens=args.warmup + args.steps + 1, ignore_eos=True)
        ids = [eng.add_request(torch.randint(3, cfg.vocab_size, (args.context,), generator=gen).tolist(), params)
               for _ in range(b)]
        while any(s.num_computed < len(s.prompt_ids) for s in eng.scheduler.running) or eng.scheduler.waiting:
            eng.step()
        for _ in range(args.warmup):
            eng.step()
        times = timed(eng.step, device, args.steps)
        for rid in ids:
            eng.abort(rid)
        ctx = args.context + args.warmup + args.steps // 2  # mean context during the timed steps
        kv_bytes = b * ctx * cfg.kv_bytes_per_token(itemsize)
        s = summary(times)
        row = {"batch": b, **s, "tokens_per_s": b / (s["median_ms"] / 1e3),
               "bytes_per_step": weight_bytes + kv_bytes,
               "bound_ms_measured_bw": 1e3 * (weight_bytes + kv_bytes) / bw_measured}
        if bw_sheet:
            row["bound_ms_datasheet_bw"] = 1e3 * (weight_bytes + kv_bytes) / bw_sheet
            row["ratio_to_datasheet_bound"] = s["median_ms"] / row["bound_ms_datasheet_bw"]
        row["ratio_to_measured_bound"] = s["median_ms"] / row["bound_ms_measured_bw"]
        rows.append(row)
        print(f"batch {b:4d}: {s['median_ms']:8.3f} ms/step  {row['tokens_per_s']:10.1f} tok/s  "
              f"bound {row['bound_ms_measured_bw']:.3f} ms (measured bw) "
              f"ratio {row['ratio_to_measured_bound']:.2f}", flush=True)
        sync(device)

    result = {"benchmark": "decode", "model": args.model, "tp": args.tp, "compile_layers": args.compile_layers, "dtype": str(eng.dtype).removeprefix("torch."),
              "params": cfg.num_params(), "weight_bytes_per_step": weight_bytes,
              "context": args.context, "steps": args.steps, "cuda_graphs": graphs,
              "bandwidth_measured_Bps": bw_measured, "bandwidth_datasheet_Bps": bw_sheet,
              "machine": machine_info(device), "results": rows}
    name = args.name or f"decode-{device.type}-{args.model}-{result['dtype']}" + (f"-tp{args.tp}" if args.tp > 1 else "")
    print(f"wrote {write_result(name, result)}")
    return result


if __name__ == "__main__":
    main()
