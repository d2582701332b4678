"""The host's speed now against its speed when it was profiled, measured right before a live run.

A machine drifts: on the 2-core dev VM the same engine step took up to 15% longer twenty minutes
after its profile, and a queue near saturation multiplies such an error several times over
(benchmarks/twin/README.md). So `splitserve twin` measures two rows of the profile again, with
the engine a worker builds, before it starts the server: a prompt step (the largest batch-1
prompt of at most 512 tokens the profile has) and a decode step (the profile's largest batch of
at most 8 at its sweep prompt). Each row's time now over the profile's, the median of `repeats`,
is the simulated host's speed for prompt and decode steps (`MachineProfile.drift`). Measured
before the run, it is a prediction; the step logs' own drift (steps.py `drift`) is read after it.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from pathlib import Path

from ..perf.profile_fit import read_profile_rows
from .machine import MachineProfile
from .profiler import ProfileSettings, _engine, measure_row


def reference_rows(rows: list[dict], sweep_prompt: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(prompt, batch, tokens) of the reference prompt row and of the reference decode row."""
    prompts = [r for r in rows if r["batch_size"] == 1 and r["prompt_size"] <= 512]
    decodes = [r for r in rows if r["prompt_size"] == sweep_prompt and r["batch_size"] <= 8]
    if not prompts or not decodes:
        raise ValueError("the profile has no batch-1 prompt row of <= 512 tokens or no batch sweep")
    p = max(prompts, key=lambda r: r["prompt_size"])
    d = max(decodes, key=lambda r: r["batch_size"])
    return ((p["prompt_size"], 1, p["token_size"]), (d["prompt_size"], d["batch_size"], d["token_size"]))


def reference_speed(machine: MachineProfile, profile_dir: str | Path, repeats: int = 5) -> tuple[float, float]:
    """(prompt, decode): a reference step's time now over its time in the profile (> 1: slower)."""
    f = machine.facts
    rows = read_profile_rows(Path(profile_dir) / "profile.csv", f["model"], f["name"], 1)
    sweep = min(r["prompt_size"] for r in rows if r["batch_size"] > 1)
    (pp, pb, pt), (dp, db, dt) = reference_rows(rows, sweep)

    def then(p: int, b: int, key: str) -> float:
        return statistics.median(r[key] for r in rows if (r["prompt_size"], r["batch_size"]) == (p, b))

    s = ProfileSettings(model=f["model"], device=f["device"], dtype=f["dtype"], num_blocks=f["num_blocks"],
                        threads=int(f["how"]["threads_per_worker"]))
    engine = _engine(s, prompt_cap=max(pp * pb, dp * db), max_seqs=db)
    rng = random.Random(0)
    measure_row(engine, 64, 1, 4, rng)  # warm-up, as the profile
    prompt = statistics.median(measure_row(engine, pp, pb, pt, rng)["prompt_time"] for _ in range(repeats))
    decode = statistics.median(measure_row(engine, dp, db, dt, rng)["token_time"] for _ in range(repeats))
    return prompt / then(pp, pb, "prompt_time"), decode / then(dp, db, "token_time")


def calibrated(machine: MachineProfile, profile_dir: str | Path) -> MachineProfile:
    """`machine` at the speed its reference rows run now (drift: prompt, decode)."""
    return dataclasses.replace(machine, drift=reference_speed(machine, profile_dir))
