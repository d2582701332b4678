"""The host's speed now against its profile, measured right before a live run on the run's own shapes.

A machine drifts: the same engine step takes longer some time after its profile. And the fitted
step model is not equally right at every shape, so reference rows of the profile timed again say
little about the speed at the run's own shapes (benchmarks/twin/recorded/README.md). So
`splitserve twin` times, with the engine a
worker builds, a sample of the requests the run will send (`run_shapes`: their prompt and output
sizes, drawn with the run's seed), each alone, and compares each step with the model's time for
it (`shape_ratios`): the median ratio per kind is the simulated host's speed for prompt and decode
steps (`MachineProfile.drift`), as the run's own lone steps are read after it (steps.run_speed).

That engine is not quite a serving worker: the worker's other threads, its prefix cache and the
KV it sends share the step, so short prompts run slower in the workers than in the bare engine.
So a live run is also calibrated
through its own workers (`through_workers`): the sampled requests sent to the server one at a
time right before the bench (and again right after it), their logged steps read as the run's
are (`window_speed`). The bare engine's figure is what `twin --load` sizes the run with.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Callable

import httpx

from .machine import MachineProfile
from .profiler import ProfileSettings, profiling_engine, measure_row
from .run import TwinSpec, planned
from .steps import Step, run_speed

SAMPLE = 16  # requests of the run timed alone


def run_shapes(spec: TwinSpec, n: int = SAMPLE) -> list[tuple[int, int]]:
    """(prompt tokens, output tokens) of `n` of the requests `spec` sends (all if fewer), drawn with
    its seed; conversations: their first turns, whose later turns' new tokens are of the same size."""
    reqs = [(r.prompt_tokens, r.output_tokens) for r in planned(spec)]
    return sorted(random.Random(spec.seed).sample(reqs, min(n, len(reqs))))


def model_times(machine: MachineProfile, prompt: int, outputs: int) -> tuple[float, float]:
    """(prompt step, decode steps summed) in seconds as the step model puts one request of `prompt`
    tokens generating `outputs` alone on an idle host (the step log's shapes, steps.step_of)."""
    perf = machine.perf
    first = perf.mixed_time(prompt, 0, 0, prompt * prompt if perf.attention else 0)
    decodes = sum(perf.mixed_time(0, 1, machine.timing.decode_kv(prompt + i, 1)) for i in range(1, outputs))
    return first, decodes


def shape_ratios(engine, machine: MachineProfile, shapes: list[tuple[int, int]],
                 rng: random.Random) -> tuple[list[float], list[float]]:
    """(prompt, decode): each shape's steps timed now over the model's (model_times)."""
    prompts: list[float] = []
    decodes: list[float] = []
    for p, t in shapes:
        row = measure_row(engine, p, 1, t, rng)
        first, rest = model_times(machine, p, t)
        prompts.append(row["prompt_time"] / 1e3 / first)
        if t > 1 and rest > 0:
            decodes.append(row["token_time"] / 1e3 * (t - 1) / rest)
    return prompts, decodes


def shape_speed(machine: MachineProfile, spec: TwinSpec, n: int = SAMPLE) -> tuple[float, float]:
    """(prompt, decode): the median over `n` of the run's requests (run_shapes) of their steps' time
    now over the model's (> 1: slower); a kind without such a step keeps 1.0."""
    f = machine.facts
    shapes = run_shapes(spec, n)
    s = ProfileSettings(model=f["model"], device=f["device"], dtype=f["dtype"], num_blocks=f["num_blocks"],
                        threads=int(f["how"]["threads_per_worker"]))
    engine = profiling_engine(s, prompt_cap=max(p for p, _ in shapes), max_seqs=1)
    rng = random.Random(0)
    measure_row(engine, 64, 1, 4, rng)  # warm-up, as the profile
    prompts, decodes = shape_ratios(engine, machine, shapes, rng)
    return (statistics.median(prompts) if prompts else 1.0, statistics.median(decodes) if decodes else 1.0)


def calibrated(machine: MachineProfile, spec: TwinSpec) -> MachineProfile:
    """`machine` at the speed the run's own shapes run now (drift: prompt, decode)."""
    return dataclasses.replace(machine, drift=shape_speed(machine, spec))


def through_workers(spec: TwinSpec, n: int = 2 * SAMPLE) -> Callable[[str], None]:
    """A calibration for run.run_live: `n` of the run's requests (run_shapes) sent to the server at
    the URL one at a time, random token ids, exactly their output tokens; conversations: each also
    followed by its second turn (the first, a reply and as many new tokens again), whose prompt
    step computes past a prefix-cache hit as the run's later turns do."""
    shapes = run_shapes(spec, n)

    def send(url: str) -> None:
        rng = random.Random(spec.seed)
        with httpx.Client(base_url=url, timeout=120) as client:
            for p, t in shapes:
                prompt = [rng.randrange(3, 200) for _ in range(p)]
                turns = [prompt, prompt + [rng.randrange(3, 200) for _ in range(t + p)]] if spec.shares_prefixes \
                    else [prompt]
                for ids in turns:
                    r = client.post("/v1/completions", json={"prompt": ids, "max_tokens": t, "temperature": 0.0,
                                                             "ignore_eos": True})
                    r.raise_for_status()
    return send


def in_window(steps: list[Step], window: list[float] | None) -> list[Step]:
    """The steps that began inside `window` ([start, end] wall-clock seconds; None: none)."""
    return [] if window is None else [s for s in steps if window[0] <= s.start <= window[1]]


def between(steps: list[Step], calibration: dict[str, list[float]]) -> list[Step]:
    """The run's own steps: those after the calibration before it and before the one after it."""
    lo = calibration.get("before", [0.0, float("-inf")])[1]
    hi = calibration.get("after", [float("inf")])[0]
    return [s for s in steps if lo < s.start < hi]


def window_speed(steps: list[Step], machine: MachineProfile, under: MachineProfile,
                 window: list[float] | None) -> tuple[float, float] | None:
    """(prompt, decode) drift of `machine` at the speed of the lone steps inside `window` (steps.run_speed);
    None without such a window."""
    inside = in_window(steps, window)
    return run_speed(inside, machine, under).drift if inside else None
