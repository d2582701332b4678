"""Prefix caching in the engine (issue 28's "How fast", CPU, `small`):

1. time to first token of a prompt 90% of which is cached, against the same prompt uncached
   (target: at most 0.25x): an engine with caching runs a prompt sharing the first 90% of the
   tokens (in whole blocks), then the measured one; an engine without caching runs the measured
   one alone; alternated, `--repeats` pairs, medians;
2. what naming and looking blocks up costs a decode step (target: at most 2%): a decode-only run
   of `--batch` sequences, the scheduler's `_register` (hashing each block as it fills) and
   `attach_cached` timed inside the steps, against the steps' own time.

    python benchmarks/engine/prefix_cache.py [--model small] [--prompt 1024] [--out FILE.json]
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


def ttft(eng: LLMEngine, prompt: list[int]) -> tuple[float, int]:
    """Seconds from add_request to the first token, and the prompt tokens its prefill took from the cache."""
    t0 = time.perf_counter()
    eng.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    while True:
        outs = eng.step()
        if outs:
            return time.perf_counter() - t0, outs[0].num_cached_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens of the measured request")
    ap.add_argument("--cached", type=float, default=0.9, help="fraction of it cached (rounded down to blocks)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16, help="decoding sequences in part 2")
    ap.add_argument("--decode-steps", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    kw = dict(tokenizer=None, max_num_seqs=max(a.batch, 4), batching=BatchingConfig(prompt_token_cap=max(2048, a.prompt)))
    on, off = LLMEngine(a.model, EngineConfig(**kw)), LLMEngine(a.model, EngineConfig(prefix_caching=False, **kw))
    bs = on.blocks.block_size
    shared = -(-int(a.prompt * a.cached) // bs) * bs  # at least that fraction, in whole blocks
    ttft(on, torch.randint(3, 1000, (a.prompt,), generator=g).tolist())  # warm both up
    ttft(off, torch.randint(3, 1000, (a.prompt,), generator=g).tolist())
    cold, warm, hits = [], [], []
    for _ in range(a.repeats):
        head = torch.randint(3, 1000, (shared,), generator=g).tolist()
        first = head + torch.randint(3, 1000, (a.prompt - shared,), generator=g).tolist()
        second = head + torch.randint(3, 1000, (a.prompt - shared,), generator=g).tolist()
        ttft(on, first)                          # fills the cache with the shared head
        t, k = ttft(on, second)
        warm.append(t)
        hits.append(k)
        cold.append(ttft(off, second)[0])
    ratio = statistics.median(w / c for w, c in zip(warm, cold))
    print(f"TTFT of a {a.prompt}-token prompt, {shared} tokens ({shared / a.prompt:.1%}) cached: "
          f"{statistics.median(warm) * 1e3:.1f} ms against {statistics.median(cold) * 1e3:.1f} ms uncached "
          f"({ratio:.3f}x; target <= 0.25x); cached tokens seen {sorted(set(hits))}")

    # 2. naming and lookup inside decode steps
    sched = on.scheduler
    spent = {"register": 0.0, "attach": 0.0}

    def timed(name, fn):
        def wrapper(*args):
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                spent[name] += time.perf_counter() - t0
        return wrapper

    sched._register = timed("register", sched._register)
    sched.attach_cached = timed("attach", sched.attach_cached)
    ctx = 256
    for _ in range(a.batch):
        on.add_request(torch.randint(3, 1000, (ctx,), generator=g).tolist(),
                       SamplingParams(max_tokens=a.decode_steps + 1, ignore_eos=True))
    on.step()  # the prefills
    spent = dict.fromkeys(spent, 0.0)
    t0 = time.perf_counter()
    steps = 0
    while on.has_unfinished():
        on.step()
        steps += 1
    total = time.perf_counter() - t0
    share = (spent["register"] + spent["attach"]) / total
    print(f"{steps} decode steps of {a.batch} sequences ({ctx}-token prompts): {total / steps * 1e3:.2f} ms a "
          f"step; naming and lookup {(spent['register'] + spent['attach']) / steps * 1e6:.1f} us a step "
          f"({share:.2%}; target <= 2%)")
    result = {
        "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                    "torch": torch.__version__, "threads": a.threads},
        "model": a.model, "prompt": a.prompt, "cached_tokens": shared,
        "ttft_cached_s": warm, "ttft_uncached_s": cold, "ttft_ratio_median": ratio,
        "decode_steps": steps, "batch": a.batch, "decode_step_s": total / steps,
        "naming_and_lookup_s": spent, "naming_and_lookup_share": share,
    }
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
