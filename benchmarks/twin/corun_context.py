"""Does a decode step's co-run slowdown depend on the KV it reads? A decode step of 8 sequences
timed at two contexts (32 and 448 tokens of KV each), alone and beside an engine process running
prompt steps of 128 tokens or decode steps of 8 sequences (twin/corun.py's HOG), taking turns in
each round as `splitserve profile` does; `--same-core` pins it and the engine beside to one core
and reads CPU seconds (the time-shared core's growth, corun `same_core`), otherwise wall seconds
where the OS puts them. Prints the median of the rounds' ratios - 1 per context.

    python benchmarks/twin/corun_context.py [--rounds 7] [--same-core]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import time

from splitserve.twin.corun import HOG, timed_steps
from splitserve.twin.profiler import ProfileSettings, profiling_engine

CONTEXTS = (32, 448)
BESIDE = (("prompt", 128), ("decode", 8))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--same-core", action="store_true", help="pin both to one core; CPU seconds")
    ap.add_argument("--model", default="small-mha")
    a = ap.parse_args()
    engine = profiling_engine(ProfileSettings(model=a.model, num_blocks=2048, threads=1), 4096, 64)
    rng = random.Random(0)
    hogs = {k: subprocess.Popen([sys.executable, "-c", HOG, a.model, "cpu", "float32", "1", k[0], str(k[1])],
                                stdout=subprocess.PIPE, text=True) for k in BESIDE}
    for h in hogs.values():
        assert h.stdout is not None
        h.stdout.readline()
        h.send_signal(signal.SIGSTOP)
    got: dict = {}
    cores = os.sched_getaffinity(0)
    try:
        for _ in range(a.rounds):
            for ctx in CONTEXTS:
                for cond in (None, *BESIDE):
                    for k, h in hogs.items():
                        h.send_signal(signal.SIGCONT if cond == k else signal.SIGSTOP)
                    if a.same_core:
                        for pid in (0, *(h.pid for h in hogs.values())):
                            os.sched_setaffinity(pid, {min(cores)} if cond else cores)
                    time.sleep(0.05)
                    got.setdefault((ctx, cond), []).append(timed_steps(engine, ctx, 8, 8, rng)[3 if a.same_core else 2])
    finally:
        for h in hogs.values():
            h.kill()
            h.wait()
    for ctx in CONTEXTS:
        alone = got[(ctx, None)]
        cells = [f"beside {k} {n}: {statistics.median(y / x for x, y in zip(alone, got[(ctx, (k, n))])) - 1:+.1%}"
                 for k, n in BESIDE]
        print(f"decode of 8 at {ctx} tokens of KV: alone {statistics.median(alone):.1f} ms; " + "; ".join(cells))


if __name__ == "__main__":
    main()
