"""The calibration before a live run (twin/calibrate.py): the run's own request sizes, timed alone,
against the step model's time for the same steps, by hand."""

from __future__ import annotations

import random

import pytest

from splitserve.twin import calibrate
from splitserve.twin.machine import MachineProfile
from splitserve.twin.run import TwinSpec, planned


class _Perf:
    """A step model by hand: a prompt of p tokens 1 ms + 0.1 ms a token + 1e-6 s a token squared
    (attention); a decode step 5 ms + 1 us per KV token."""
    attention = 1e-6

    def mixed_time(self, prompt_tokens, batch, context, prompt_sq=0):
        if batch == 0:
            return 0.001 + 1e-4 * prompt_tokens + self.attention * prompt_sq
        assert prompt_tokens == 0 and batch == 1
        return 0.005 + 1e-6 * context


def _machine():
    return MachineProfile(name="m", facts={"block_size": 16}, perf=_Perf(), model=None, link=None, transport="tcp")


def test_model_times_are_the_step_logs_shapes_by_hand():
    # a 100-token prompt: 1 + 10 + 10 ms; then 3 decodes over 101, 102, 103 KV tokens, each
    # gathered in whole 16-token blocks: 112 tokens each
    first, rest = calibrate.model_times(_machine(), 100, 4)
    assert first == pytest.approx(0.021)
    assert rest == pytest.approx(3 * (0.005 + 112e-6))
    assert calibrate.model_times(_machine(), 100, 1)[1] == 0.0


def test_the_ratios_are_time_now_over_the_model(monkeypatch):
    m = _machine()

    def row(engine, p, b, t, rng):  # the engine runs prompts at 2x the model and decodes at 3x
        first, rest = calibrate.model_times(m, p, t)
        return {"prompt_time": 2e3 * first, "token_time": 3e3 * rest / (t - 1) if t > 1 else 0.0}

    monkeypatch.setattr(calibrate, "measure_row", row)
    prompts, decodes = calibrate.shape_ratios(None, m, [(16, 8), (100, 1), (256, 4)], random.Random(0))
    assert prompts == pytest.approx([2.0, 2.0, 2.0])
    assert decodes == pytest.approx([3.0, 3.0])  # a one-token request has no decode step


def test_the_shapes_are_the_runs_own_requests_drawn_with_its_seed():
    spec = TwinSpec(workload="coding", rps=4.0, duration=10.0, seed=3, max_prompt_tokens=256, max_tokens_cap=8)
    sizes = [(r.prompt_tokens, r.output_tokens) for r in planned(spec)]
    shapes = calibrate.run_shapes(spec, 16)
    assert len(shapes) == 16 and shapes == calibrate.run_shapes(spec, 16)
    assert all(s in sizes for s in shapes)
    assert max(p for p, _ in shapes) <= 256 and max(t for _, t in shapes) <= 8
    assert len(calibrate.run_shapes(TwinSpec(workload="coding", rps=1.0, duration=3.0, seed=3), 16)) <= 4


def test_the_runs_steps_are_those_between_its_calibrations():
    from splitserve.twin.steps import Step

    steps = [Step(0, t, 0.01, 16, 256, 0, 0) for t in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)]
    windows = {"before": [0.5, 2.5], "after": [5.5, 7.0]}
    assert [s.start for s in calibrate.in_window(steps, windows["before"])] == [1.0, 2.0]
    assert [s.start for s in calibrate.in_window(steps, windows["after"])] == [6.0]
    assert [s.start for s in calibrate.between(steps, windows)] == [3.0, 4.0, 5.0]
    assert calibrate.between(steps, {}) == steps and calibrate.in_window(steps, None) == []
