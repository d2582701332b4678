"""The profile's mixed steps (twin/profiler.measure_mixed): the timed step runs the prompt and
every decode together, or the measurement is refused. With the CI grid's limits (8 requests) it
once timed three of its four shapes as decode steps (40 ms where the prompt alone took 350 ms)."""

from __future__ import annotations

import random

import pytest

import splitserve.twin.profiler as profiler
from splitserve.twin.bounds import CI_GRID
from splitserve.twin.profiler import ProfileSettings, profiling_engine, engine_limits, measure_mixed

SMALL = ((4, 64, 128), (8, 64, 128), (16, 32, 128), (8, 64, 64))  # MIXED's shapes / 4, for `tiny` (512 tokens)


def test_the_profiling_engine_admits_every_mixed_step_whatever_the_grid():
    for grid, shapes in ((CI_GRID.grid(), profiler.MIXED), ([(64, 1, 4), (32, 8, 4)], SMALL)):
        prompt_cap, max_seqs = engine_limits(grid)
        assert max_seqs >= max(b for b, _, _ in shapes) + 1 and prompt_cap >= max(p + b for b, _, p in shapes)
    assert engine_limits(CI_GRID.grid()) == (1024, 17)


def test_a_grid_of_8_requests_measures_each_prompt_with_its_decodes(monkeypatch):
    monkeypatch.setattr(profiler, "MIXED", SMALL)
    engine = profiling_engine(ProfileSettings(model="tiny"), *engine_limits([(64, 1, 4), (32, 8, 4)]))
    got = measure_mixed(engine, random.Random(0), repeats=1)
    # the step's shape is checked inside; each decode read its prompt and the two or three tokens
    # decoded before (three where the cap of 256 tokens split the decodes' prefill in two steps)
    assert [(q["decodes"], q["prompt"]) for q in got] == [(b, p) for b, _, p in SMALL]
    assert [q["context"] for q in got] == [4 * 66, 8 * 66 + 4, 16 * 34 + 8, 8 * 66 + 4]
    assert all(q["ms"] > 0 for q in got)


def test_an_engine_that_would_run_the_prompt_alone_is_refused(monkeypatch):
    monkeypatch.setattr(profiler, "MIXED", SMALL)
    engine = profiling_engine(ProfileSettings(model="tiny"), prompt_cap=256, max_seqs=8)  # the old limits
    with pytest.raises(RuntimeError, match="8 decodes and a 128-token prompt ran as 8 sequences"):
        measure_mixed(engine, random.Random(0), repeats=1)
