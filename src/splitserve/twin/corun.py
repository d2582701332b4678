"""The co-run measurement of `splitserve profile`: how much longer a worker's engine step takes
next to another busy engine process of the same model, on another core (shared caches and memory
bandwidth) and time-sharing its own core (MachineProfile.slowdown reads both)."""

from __future__ import annotations

import os
import random
import statistics
import time

# an engine process that prefills and decodes without pause
HOG = """
import sys, time, torch
from splitserve.engine.engine import LLMEngine
from splitserve.engine.sampler import SamplingParams
torch.set_num_threads(int(sys.argv[4]))
e = LLMEngine(sys.argv[1], device=sys.argv[2], dtype=sys.argv[3], tokenizer=None, prefix_caching=False)
print("ready", flush=True)
while True:
    for i in range(4):
        e.add_request(list(range(3 + i, 259 + i)), SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    while e.has_unfinished():
        e.step()
"""


def timed_steps(engine, p: int, b: int, t: int, rng: random.Random) -> tuple[float, float, float, float]:
    """b requests of p random prompt tokens generating t tokens each: (the prompt step's wall and
    CPU ms, the mean decode step's wall and CPU ms); CPU: this process's (time.process_time)."""
    from ..engine.sampler import SamplingParams

    params = SamplingParams(max_tokens=t, temperature=0.0, ignore_eos=True)
    for _ in range(b):
        engine.add_request([rng.randrange(3, engine.cfg.vocab_size) for _ in range(p)], params)
    steps = []
    while engine.has_unfinished():
        t0, c0 = time.perf_counter(), time.process_time()
        engine.step()
        steps.append((time.perf_counter() - t0, time.process_time() - c0))
    decode = steps[1:] or [(0.0, 0.0)]
    return (steps[0][0] * 1e3, steps[0][1] * 1e3, statistics.fmean(w for w, _ in decode) * 1e3,
            statistics.fmean(c for _, c in decode) * 1e3)


def measure_corun(engine, model: str, device: str, threads: int, rng: random.Random, rounds: int = 9) -> dict:
    """How much slower a step runs next to another engine of the same model: a 512-token prompt
    step and a decode step of 8 requests (the mean of 7), in each round alone (the other process
    stopped, SIGSTOP), next to it running where the OS puts it (on another core: the two share
    caches and memory bandwidth; `prompt`, `token`: the median of the rounds' wall-time ratios,
    - 1), and pinned with it to one core (`same_core`: each step's CPU seconds over alone's, - 1:
    two processes time-sharing a core evict each other's caches, so a step's work grows; its
    wall time is about twice that, the time-sharing itself). Taking turns within each round, the
    machine's drift hits every condition alike. Without sched_setaffinity (not Linux), or on one
    core, `same_core` is not measured (0)."""
    import signal
    import subprocess
    import sys

    conditions = ("alone", "shared", "same core")
    got: dict[str, list[tuple[float, float, float, float]]] = {c: [] for c in conditions}
    pinnable = hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1
    mine = os.sched_getaffinity(0) if pinnable else set()
    hog = subprocess.Popen([sys.executable, "-c", HOG, model, device, str(engine.dtype).removeprefix("torch."),
                            str(threads)], stdout=subprocess.PIPE, text=True)
    try:
        hog.stdout.readline()  # loaded
        for _ in range(rounds):
            for cond in conditions if pinnable else conditions[:2]:
                hog.send_signal(signal.SIGSTOP if cond == "alone" else signal.SIGCONT)
                core = {min(mine)} if cond == "same core" else mine
                if pinnable:
                    os.sched_setaffinity(0, core)
                    os.sched_setaffinity(hog.pid, core)
                time.sleep(0.05)  # the signal and the move take effect at once; a moment to settle
                prompt, decode = timed_steps(engine, 512, 1, 2, rng), timed_steps(engine, 32, 8, 8, rng)
                got[cond].append((prompt[0], decode[2], prompt[1], decode[3]))
    finally:
        if pinnable:
            os.sched_setaffinity(0, mine)
        hog.kill()
        hog.wait()

    def ratio(cond: str, i: int) -> float:  # i: 0 / 1 prompt / decode wall, 2 / 3 their CPU
        alone = got["alone"]
        return statistics.median(y[i] / x[i] for x, y in zip(alone, got[cond])) - 1.0 if got[cond] else 0.0

    return {"prompt": ratio("shared", 0), "token": ratio("shared", 1),
            "alone_ms": [statistics.median(x[i] for x in got["alone"]) for i in (0, 1)],
            "shared_ms": [statistics.median(x[i] for x in got["shared"]) for i in (0, 1)],
            "same_core": {"prompt": ratio("same core", 2), "token": ratio("same core", 3)},
            "how": f"512-token prompt step and 8-request decode step, {rounds} rounds each alone (the other "
                   "engine process stopped), next to it (running where the OS puts it: wall-time ratios) and "
                   + ("pinned with it to one core (CPU-time ratios)" if pinnable else
                      "not pinned with it (no sched_setaffinity or one core: same_core not measured)")
                   + "; the median of the rounds' ratios"}
