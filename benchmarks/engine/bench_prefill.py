"""Prefill time of one prompt and the achieved FLOP/s, against the device's peak.

    python benchmarks/engine/bench_prefill.py                       # CUDA: llama3-8b bf16, 2048 tokens
    python benchmarks/engine/bench_prefill.py --device cpu --model small --tokens 512

Each repetition adds one `--tokens`-token request with max_tokens=1 and times the engine step
that prefills it (LM head on the last position only). FLOPs counted: 2 x (non-embedding
weights) per token, the causal attention (2 x T^2 x heads x head_dim per layer: QK^T and PV
over the lower triangle) and the LM head for one token. Peak: the GPU datasheet's dense bf16
figure; on CPU the best measured square matmul in the same dtype (there is no datasheet here).
Writes results/prefill-<device>-<model>-<dtype>.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import (engine_parser, add_threads_arg, apply_threads, gpu_datasheet, machine_info,  # noqa: E402
                    measured_matmul_flops, summary, timed, write_result)

from splitserve.engine.engine import EngineConfig, LLMEngine  # noqa: E402
from splitserve.policy.machine import BatchingConfig  # noqa: E402
from splitserve.engine.sampler import SamplingParams  # noqa: E402


def prefill_flops(cfg, tokens: int) -> float:
    h = cfg.hidden_size
    linear = cfg.num_params() - cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    attention = 2 * tokens * tokens * cfg.num_heads * cfg.head_dim * cfg.num_layers
    return 2 * linear * tokens + attention + 2 * cfg.vocab_size * h


def main(argv: list[str] | None = None) -> dict:
    cuda = torch.cuda.is_available()
    ap = engine_parser(__doc__)
    ap.add_argument("--tokens", type=int, default=2048 if cuda else 512)
    ap.add_argument("--reps", type=int, default=10 if cuda else 5)
    ap.add_argument("--name", default=None, help="result file name (without .json)")
    ap.add_argument("--tp", type=int, default=1, help="tensor parallel ranks (gloo on CPU: one process each)")
    add_threads_arg(ap)
    args = ap.parse_args(argv)
    apply_threads(args.threads)

    device = torch.device(args.device)
    eng = LLMEngine(args.model, EngineConfig(device=device, dtype=args.dtype, tp=args.tp, max_num_seqs=1,
                                             max_model_len=args.tokens + 8,
                                             batching=BatchingConfig(prompt_token_cap=args.tokens),
                                             prefix_caching=False))  # each repeat computes the whole prompt
    cfg = eng.cfg
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, cfg.vocab_size, (args.tokens,), generator=gen).tolist()
    params = SamplingParams(max_tokens=1, ignore_eos=True)

    def one():
        eng.add_request(prompt, params)
        outs = eng.step()
        assert outs and outs[0].finished

    one()  # warm-up
    times = timed(one, device, args.reps)
    s = summary(times)
    flops = prefill_flops(cfg, args.tokens)
    achieved = flops / (s["median_ms"] / 1e3)
    if device.type == "cuda":
        peak, peak_src = gpu_datasheet(device)[0], "datasheet dense bf16"
    else:
        peak, peak_src = None, None
    measured_peak = measured_matmul_flops(device, eng.dtype)
    result = {"benchmark": "prefill", "model": args.model, "tp": args.tp, "dtype": str(eng.dtype).removeprefix("torch."),
              "tokens": args.tokens, **s, "flops": flops, "achieved_flops_per_s": achieved,
              "tokens_per_s": args.tokens / (s["median_ms"] / 1e3),
              "peak_flops_per_s": peak, "peak_source": peak_src,
              "fraction_of_peak": achieved / peak if peak else None,
              "measured_matmul_flops_per_s": measured_peak,
              "fraction_of_measured_matmul": achieved / measured_peak,
              "machine": machine_info(device)}
    print(f"prefill {args.tokens} tokens: {s['median_ms']:.2f} ms, {achieved / 1e12:.3f} TFLOP/s "
          f"({result['fraction_of_measured_matmul']:.0%} of measured matmul"
          + (f", {result['fraction_of_peak']:.0%} of {peak / 1e12:.0f} TFLOP/s peak" if peak else "") + ")")
    name = args.name or f"prefill-{device.type}-{args.model}-{result['dtype']}" + (f"-tp{args.tp}" if args.tp > 1 else "")
    print(f"wrote {write_result(name, result)}")
    return result


if __name__ == "__main__":
    main()
