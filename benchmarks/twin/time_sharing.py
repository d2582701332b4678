"""What a worker's step costs next to busy workers, pinned: an engine of the CI grid's model on
core 0 times a 256-token prompt step and a decode step of 8 requests, wall and CPU seconds, alone,
next to a busy engine process on core 1 (what the profile's co-run figure measures), on core 0
(time-sharing its core: what its `same_core` measures), and on core 0 with two more on core 1
(four workers on two cores, all busy). The busy processes are stopped (SIGSTOP) in the
conditions that do not use them, so that the machine's drift hits every condition alike; the
median of `--rounds` rounds, as x the step alone.

    python benchmarks/twin/time_sharing.py [--rounds 5]    # ~1 min on the 2-core VM; Linux, 2+ cores

benchmarks/twin/README.md ("The baseline's P50s measured a mixing fraction" and the section after
it) has its figures.
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

from splitserve.twin.bounds import CI_GRID
from splitserve.twin.corun import HOG, timed_steps
from splitserve.twin.profiler import profiling_engine

CONDITIONS = {"alone": [], "other core": ["core 1"], "same core": ["core 0"],
              "same core, 2 on the other": ["core 0", "core 1", "core 1 again"]}


def busy(core: int) -> subprocess.Popen:
    p = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", HOG, CI_GRID.model, CI_GRID.device,
                          "float32", "1"], stdout=subprocess.PIPE, text=True)
    p.stdout.readline()  # loaded
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    os.sched_setaffinity(0, {0})
    import torch

    torch.set_num_threads(1)
    engine, rng = profiling_engine(CI_GRID, 4096, 64), random.Random(0)
    procs = {"core 0": busy(0), "core 1": busy(1), "core 1 again": busy(1)}
    got: dict[str, list[tuple[float, ...]]] = {c: [] for c in CONDITIONS}
    try:
        for _ in range(a.rounds):
            for cond, on in CONDITIONS.items():
                for name, p in procs.items():
                    p.send_signal(signal.SIGCONT if name in on else signal.SIGSTOP)
                time.sleep(0.3)
                prompt, decode = timed_steps(engine, 256, 1, 2, rng), timed_steps(engine, 32, 8, 16, rng)
                got[cond].append((prompt[0], prompt[1], decode[2], decode[3]))
    finally:
        for p in procs.values():
            p.kill()
    alone = [statistics.median(x[i] for x in got["alone"]) for i in range(4)]
    print(f"{'':26s} {'prompt wall':>17s} {'CPU':>17s} {'decode wall':>17s} {'CPU':>17s}")
    for cond, times in got.items():
        m = [statistics.median(x[i] for x in times) for i in range(4)]
        print(f"{cond:26s} " + " ".join(f"{m[i]:7.1f} ms x{m[i] / alone[i]:.3f}" for i in range(4)))


if __name__ == "__main__":
    main()
