"""The live router's Aladdin latency model (policy/latency.py LIVE_FIT): Eq. 2 and Eq. 3 fitted by
least squares to the tiny model's engine steps on this machine (CPU, float32, one thread).

    python scripts/aladdin_live_fit.py

Prefill: one prompt of 16..512 tokens alone (max_tokens 1), the step's time. Decode: `b` requests
(1..32) of `c` prompt tokens (16..480), the median of 5 decode steps once all are prefilled.
Prints the coefficients and the fit's largest relative error."""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.sampler import SamplingParams


def timed(eng: LLMEngine) -> float:
    t = time.perf_counter()
    eng.step()
    return time.perf_counter() - t


def main() -> None:
    torch.set_num_threads(1)
    eng = LLMEngine("tiny", EngineConfig(tokenizer=None, num_blocks=4096, prefix_caching=False))
    rid = 0
    pre = []
    for n in (16, 32, 64, 128, 256, 480) * 4:
        eng.add_request([1 + i % 200 for i in range(n)], SamplingParams(max_tokens=1, ignore_eos=True), str(rid))
        rid += 1
        pre.append((n, timed(eng)))
        while eng.has_unfinished():
            eng.step()
    dec = []
    for b in (1, 4, 8, 16, 32):
        for c in (16, 128, 480):
            for _ in range(b):
                eng.add_request([1 + i % 200 for i in range(c)], SamplingParams(max_tokens=b + 12, ignore_eos=True),
                                str(rid))
                rid += 1
            for _ in range(b + 1):      # the prompts (whatever the prompt cap groups), one token each
                eng.step()
            ts = [timed(eng) for _ in range(5)]
            dec.append((b, b * (c + 4), statistics.median(ts)))
            while eng.has_unfinished():
                eng.step()
    pre = pre[6:]                       # the first round warms the engine up
    x = np.array([[n, 1.0] for n, _ in pre])
    y = np.array([t for _, t in pre])
    (k1, c1), *_ = np.linalg.lstsq(x, y, rcond=None)
    x2 = np.array([[ctx, b, 1.0] for b, ctx, _ in dec])
    y2 = np.array([t for *_, t in dec])
    (k2, c2, c3), *_ = np.linalg.lstsq(x2, y2, rcond=None)
    err1 = max(abs(k1 * n + c1 - t) / t for n, t in pre)
    err2 = max(abs(k2 * ctx + c2 * b + c3 - t) / t for b, ctx, t in dec)
    print(f"LinearLatency(k1={k1:.3g}, c1={c1:.3g}, k2={k2:.3g}, c2={c2:.3g}, c3={c3:.3g})")
    print("prefill", [(n, round(t * 1e3, 3)) for n, t in pre])
    print("decode", [(b, ctx, round(t * 1e3, 3)) for b, ctx, t in dec])
    print(f"largest relative error: prefill {err1:.0%}, decode {err2:.0%}")


if __name__ == "__main__":
    main()
