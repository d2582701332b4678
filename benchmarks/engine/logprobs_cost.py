"""What log-probabilities cost a decode step (issue 28's "How fast": at most 10% slower with
logprobs on, top 5; CPU, `small`): one engine, with and without `SamplingParams.logprobs`, each
decoding `--batch` sequences of a `--context`-token prompt for `--steps` steps, alternated
`--repeats` times (each first in turn); the median ratio of the per-step times.

    python benchmarks/engine/logprobs_cost.py [--model small] [--batch 16] [--top 5] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.sampler import SamplingParams
from splitserve.policy.machine import BatchingConfig


def decode_step_s(eng: LLMEngine, prompts: list[list[int]], steps: int, logprobs: int | None) -> float:
    """Seconds per decode step of `prompts` decoding together (their prefills not timed)."""
    for p in prompts:
        eng.add_request(p, SamplingParams(max_tokens=steps + 1, ignore_eos=True, logprobs=logprobs))
    while any(s.num_computed < len(s.prompt_ids) for s in eng.requests.by_id.values()):
        eng.step()
    eng.step()  # the step that makes every first token: not a pure decode step
    t0, n = time.perf_counter(), 0
    while eng.has_unfinished():
        eng.step()
        n += 1
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 1000, (a.context,), generator=g).tolist() for _ in range(a.batch)]
    eng = LLMEngine(a.model, EngineConfig(tokenizer=None, max_num_seqs=a.batch, prefix_caching=False,
                                          batching=BatchingConfig(prompt_token_cap=max(2048, a.context * a.batch))))
    decode_step_s(eng, prompts, 4, None)  # warm up
    off, on = [], []
    for r in range(a.repeats):  # alternated, each first in turn
        for lp in ((None, a.top) if r % 2 == 0 else (a.top, None)):
            (off if lp is None else on).append(decode_step_s(eng, prompts, a.steps, lp))
    ratio = statistics.median(b / x for x, b in zip(off, on))
    print(f"decode step of {a.batch} sequences ({a.context}-token prompts), {a.model}: "
          f"{statistics.median(off) * 1e3:.2f} ms without logprobs, {statistics.median(on) * 1e3:.2f} ms "
          f"with the top {a.top} ({ratio:.3f}x; target <= 1.10x)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"machine": {"cpu": platform.processor() or platform.machine(),
                                   "python": platform.python_version(), "torch": torch.__version__,
                                   "threads": a.threads},
                       "model": a.model, "batch": a.batch, "context": a.context, "steps": a.steps, "top": a.top,
                       "step_s_off": off, "step_s_on": on, "ratio_median": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
