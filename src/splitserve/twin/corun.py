"""The co-run measurement of `splitserve profile`: how much longer a worker's engine step takes
next to another busy engine process of the same model, on another core (shared caches and memory
bandwidth) and time-sharing its own core (WorkerTiming.slowdown reads both); and the same next
to an engine that runs only prompt steps and one that runs only decode steps (`beside`: which kind
of step runs beside decides how much the other slows, WorkerTiming.corun_of)."""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import time

# an engine process that computes without pause: argv[5] "prompt" runs prompt steps of argv[6]
# tokens one after another; "decode" keeps argv[6] sequences of 64-token prompts decoding for 256
# tokens each (its prompt steps a small share); "mixed" prefills 4 prompts of 256 tokens and
# decodes them for 64 tokens, again and again
HOG = """
import sys, time, torch
from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.sampler import SamplingParams
torch.set_num_threads(int(sys.argv[4]))
e = LLMEngine(sys.argv[1], EngineConfig(device=sys.argv[2], dtype=sys.argv[3], tokenizer=None, prefix_caching=False))
mode, size = sys.argv[5], int(sys.argv[6])
print("ready", flush=True)
i = live = 0
while True:
    i += 1
    if mode == "prompt":
        e.add_request(list(range(3 + i % 7, 3 + size + i % 7)), SamplingParams(max_tokens=1, ignore_eos=True))
    elif mode == "decode":
        for _ in range(size - live):
            e.add_request(list(range(3 + i % 7, 67 + i % 7)), SamplingParams(max_tokens=256, ignore_eos=True))
        live = size - sum(o.finished for o in e.step())
        continue
    else:
        for j in range(4):
            e.add_request(list(range(3 + j, 259 + j)), SamplingParams(max_tokens=64, ignore_eos=True))
    while e.has_unfinished():
        e.step()
"""
# what other workers run beside a step, as the simulator and the step logs tell it: a (kind,
# size) pair for each, the size a prompt step's computed tokens or a decode step's sequences
BESIDE_PROMPT, BESIDE_DECODE = 1, 2
Beside = tuple[tuple[int, int], ...]

# the steps run beside the one timed: (kind, size) with size the prompt tokens a prompt step
# computes, or the sequences a decode step runs; the model reads between sizes (WorkerTiming.corun_of)
BESIDE = (("prompt", 64), ("prompt", 512), ("decode", 1), ("decode", 8))


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
    step and a decode step of 8 requests (the mean of 7), in each round alone (the other processes
    stopped, SIGSTOP) and next to an engine running each kind and size of step of BESIDE, where
    the OS puts it (on another core: the two share caches and memory bandwidth;
    `beside[kind][i]["prompt" | "token"]`: the median of the rounds' wall-time ratios, - 1) and
    pinned with it to one core (`["same_core"]`: each step's CPU seconds over alone's, - 1: two
    processes time-sharing a core evict each other's caches, so a step's work grows; its wall
    time is about twice that, the time-sharing itself). `prompt`, `token` and `same_core` are
    the largest of them (the figures of a profile that did not tell the steps beside apart).
    Taking turns within each round, the machine's drift hits every condition alike. Without
    sched_setaffinity (not Linux), or on one core, `same_core` is not measured (0)."""
    pinnable = hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1
    conditions = [(k, pin) for k in BESIDE for pin in ((False, True) if pinnable else (False,))]
    got: dict = {c: [] for c in conditions}
    got[None] = []  # alone
    hogs = _start_hogs(model, device, str(engine.dtype).removeprefix("torch."), threads)
    mine = os.sched_getaffinity(0) if pinnable else set()
    try:
        for _ in range(rounds):
            for cond in [None, *conditions]:
                for k, hog in hogs.items():
                    hog.send_signal(signal.SIGCONT if cond is not None and cond[0] == k else signal.SIGSTOP)
                core = {min(mine)} if cond is not None and cond[1] else mine
                if pinnable:
                    os.sched_setaffinity(0, core)
                    for hog in hogs.values():
                        os.sched_setaffinity(hog.pid, core)
                time.sleep(0.05)  # the signal and the move take effect at once; a moment to settle
                prompt, decode = timed_steps(engine, 512, 1, 2, rng), timed_steps(engine, 32, 8, 8, rng)
                got[cond].append((prompt[0], decode[2], prompt[1], decode[3]))
    finally:
        if pinnable:
            os.sched_setaffinity(0, mine)
        for hog in hogs.values():
            hog.kill()
            hog.wait()
    return _corun_facts(got, rounds, pinnable)


def _start_hogs(model: str, device: str, dtype: str, threads: int) -> dict[tuple[str, int], subprocess.Popen]:
    """An engine process for each step of BESIDE, loaded and stopped."""
    hogs = {(k, n): subprocess.Popen([sys.executable, "-c", HOG, model, device, dtype, str(threads), k, str(n)],
                                     stdout=subprocess.PIPE, text=True) for k, n in BESIDE}
    for hog in hogs.values():
        assert hog.stdout is not None, "started with stdout=PIPE"
        hog.stdout.readline()  # loaded
        hog.send_signal(signal.SIGSTOP)
    return hogs


def _corun_facts(got: dict, rounds: int, pinnable: bool) -> dict:
    """machine.json's `corun` from the rounds' (prompt wall, decode wall, prompt CPU, decode CPU)."""
    def ratio(cond, i: int) -> float:  # i: 0 / 1 prompt / decode wall, 2 / 3 their CPU
        return statistics.median(y[i] / x[i] for x, y in zip(got[None], got[cond])) - 1.0 if got.get(cond) else 0.0

    beside: dict[str, list[dict]] = {"prompt": [], "decode": []}
    for k, n in BESIDE:
        beside[k].append({"size": n, "prompt": ratio(((k, n), False), 0), "token": ratio(((k, n), False), 1),
                          "same_core": {"prompt": ratio(((k, n), True), 2), "token": ratio(((k, n), True), 3)}})
    every = [b for bs in beside.values() for b in bs]
    return {"prompt": max(b["prompt"] for b in every), "token": max(b["token"] for b in every),
            "same_core": {x: max(b["same_core"][x] for b in every) for x in ("prompt", "token")},
            "beside": beside,
            "alone_ms": [statistics.median(x[i] for x in got[None]) for i in (0, 1)],
            "how": f"512-token prompt step and 8-request decode step, {rounds} rounds each alone (the other "
                   "engine processes stopped) and next to an engine running prompt steps of 64 and of 512 "
                   "tokens, decode steps of 1 and of 8 sequences (running where the OS puts it: wall-time "
                   "ratios" + ("; pinned with it to one core: CPU-time ratios)" if pinnable else
                               "; not pinned with it: no sched_setaffinity or one core, same_core not measured)")
                   + "; the median of the rounds' ratios"}


def figure(corun: dict, prompt: bool, beside: Beside, same_core: bool = False) -> float:
    """machine.json's co-run figure (`same_core`: the time-shared core's) for a prompt or a decode
    step beside the steps in `beside`: the largest over them, each read between the sizes the
    profile ran beside (BESIDE: linear, the ends held); the figure blind to what runs beside
    where the profile did not measure it or `beside` is empty."""
    own = "prompt" if prompt else "token"
    kinds = corun.get("beside")
    if not kinds or not beside:
        return float((corun.get("same_core", {}) if same_core else corun).get(own, 0.0))
    worst = -1.0
    for bit, size in beside:
        pts = [((b["same_core"] if same_core else b)[own], b["size"])
               for b in kinds["prompt" if bit == BESIDE_PROMPT else "decode"]]
        worst = max(worst, _between(pts, size))
    return worst


def _between(points: list[tuple[float, int]], size: int) -> float:
    """The figure at `size` on the line through (figure, size) `points`, held past either end."""
    pts = sorted(points, key=lambda p: p[1])
    if size <= pts[0][1]:
        return pts[0][0]
    for (y0, x0), (y1, x1) in zip(pts, pts[1:]):
        if size <= x1:
            return y0 + (y1 - y0) * (size - x0) / (x1 - x0)
    return pts[-1][0]
