"""The host's speed now against its profile, measured right before a live run on the run's own shapes.

A machine drifts: on the 2-core dev VM the same engine step took up to 15% longer twenty minutes
after its profile. And the fitted step model is not equally right at every shape: two reference
rows of the profile (a 512-token prompt, a batch-8 decode) timed again put the host up to 58% off
the speed the run's own steps showed, when the run's prompts were 16 tokens and its decodes one or
two sequences (benchmarks/twin/recorded/README.md). So `splitserve twin` times, with the engine a
worker builds, a sample of the requests the run will send (`run_shapes`: their prompt and output
sizes, drawn with the run's seed), each alone, and compares each step with the model's time for
it (`shape_ratios`): the median ratio per kind is the simulated host's speed for prompt and decode
steps (`MachineProfile.drift`), as the run's own lone steps are read after it (steps.run_speed).
"""

from __future__ import annotations

import dataclasses
import random
import statistics

from .machine import MachineProfile
from .profiler import ProfileSettings, profiling_engine, measure_row
from .run import TwinSpec, planned

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
    decodes = sum(perf.mixed_time(0, 1, machine.decode_kv(prompt + i, 1)) for i in range(1, outputs))
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
