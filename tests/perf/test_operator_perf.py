"""The operator-level perf model (perf/operator_perf.py): which model make_perf_model picks, its
shape (monotone, O(1) cached), its step coefficients re-derived from the script that fits them,
and its error against step latencies nobody fitted it on: BLOOM-176B's Splitwise profile rows and
the latencies Aladdin (seed 002, Table 2) prints for Llama-2 on A100."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.catalog import load_hardware, load_model
from splitserve.errors import UserError
from splitserve.perf import make_perf_model
from splitserve.perf.operator_perf import OperatorPerfModel

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT.parent / "shared" / "profiles" / "splitwise_a100_h100_perf_model.csv"


@pytest.mark.parametrize("model,hw,tp,ep,kind,source", [
    ("llama2-13b", "dgx-a100", 1, 1, "auto", "operators"),     # off the Splitwise grid
    ("opt-66b", "dgx-h100", 4, 1, "auto", "operators"),
    ("llama2-70b", "dgx-a100", 4, 1, "auto", "operators"),     # the profile has tp 4; the roofline was not fitted there
    ("llama2-70b", "dgx-h100", 8, 1, "auto", "roofline"),      # the roofline stands in for the profile it was fitted on
    ("bloom-176b", "dgx-a100", 8, 1, "auto", "roofline"),
    ("llama2-13b", "dgx-h200", 1, 1, "auto", "roofline"),      # no operator fit for the H200
    ("mixtral-8x7b", "dgx-h100", 8, 8, "auto", "roofline"),    # expert parallel: roofline only
    ("mixtral-8x7b", "dgx-h100", 2, 1, "auto", "operators"),
    ("llama2-13b", "dgx-a100", 1, 1, "roofline", "roofline"),
    ("llama2-70b", "dgx-h100", 8, 1, "operators", "operators"),
])
def test_which_model_answers(model, hw, tp, ep, kind, source):
    perf, _ = make_perf_model(load_model(model), load_hardware(hw), tp, ep=ep, kind=kind)
    assert perf.source == source


def test_refusals_are_one_line():
    with pytest.raises(UserError, match="no operator model for dgx-h200"):
        make_perf_model(load_model("llama2-13b"), load_hardware("dgx-h200"), 1, kind="operators")
    with pytest.raises(UserError, match="--perf-model must be auto, operators or roofline"):
        make_perf_model(load_model("llama2-13b"), load_hardware("dgx-a100"), 1, kind="vidur")
    with pytest.raises(UserError, match="must divide"):
        OperatorPerfModel(load_model("opt-13b"), load_hardware("dgx-a100"), 3)


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(["llama2-7b", "llama2-13b", "opt-13b", "opt-66b", "codellama-34b", "mixtral-8x7b"]),
       hw=st.sampled_from(["dgx-a100", "dgx-h100", "dgx-h100-cap"]), tp=st.sampled_from([1, 2, 4, 8]),
       t=st.integers(1, 16384), b=st.integers(1, 512), c=st.integers(0, 200_000))
def test_more_work_never_takes_less_time(model, hw, tp, t, b, c):
    perf = OperatorPerfModel(load_model(model), load_hardware(hw), tp)
    assert 0 < perf.prompt_time(t) <= perf.prompt_time(t + 1)
    assert 0 < perf.token_time(b, c) <= perf.token_time(b, c + 1) <= perf.token_time(b + 1, c + 1)
    assert perf.prompt_time(t) == perf.prompt_time(t)                 # cached, same answer


def test_the_power_cap_slows_prompts_only():
    m = load_model("llama2-13b")
    free, capped = (OperatorPerfModel(m, load_hardware(h), 2) for h in ("dgx-h100", "dgx-h100-cap"))
    s = load_hardware("dgx-h100-cap").roofline.prompt_cap_slowdown
    assert s > 1.0
    assert capped.prompt_time(2048) == pytest.approx(s * free.prompt_time(2048))
    assert capped.token_time(16, 8000) == free.token_time(16, 8000)


def test_an_moe_decode_of_one_token_runs_two_experts():
    """Mixtral at batch 1 computes 2 of 8 experts: its MLP time is below a quarter of what the
    same layer takes with all 8 experts busy at a large batch, per token."""
    perf = OperatorPerfModel(load_model("mixtral-8x7b"), load_hardware("dgx-h100"), 2)
    one, many = perf.layer_ms(1), perf.layer_ms(512)
    assert one < many
    dense = OperatorPerfModel(load_model("llama2-7b"), load_hardware("dgx-h100"), 2)   # same attention shape
    assert one > dense.layer_ms(1)                                      # two experts' weights stream, not one MLP


def test_the_committed_step_coefficients_are_the_scripts_fit():
    if not PROFILE.is_file():
        pytest.skip(f"the Splitwise profile is not at {PROFILE} (../shared beside the checkout)")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_step_overheads.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the committed coefficients are this fit" in r.stdout


# Aladdin (seed 002, §6.1 Table 2): "the prefill latency SLOs are the approximated inference latency for
# the model's context length (4096 tokens)"; decode SLOs are 1.3x "the individual request inference
# latency". A100 80GB testbed; 7B and 13B on one GPU, 70B on two (two workers on its four GPUs).
ALADDIN = [("llama2-7b", 1, 400.0, 15.0 / 1.3, False), ("llama2-13b", 1, 600.0, 30.0 / 1.3, True),
           ("llama2-70b", 2, 1600.0, 75.0 / 1.3, True)]


@pytest.mark.parametrize("model,tp,prefill_ms,decode_ms,nearer", ALADDIN)
def test_against_the_latencies_aladdin_prints(model, tp, prefill_ms, decode_ms, nearer):
    """Errors seen when this was written (docs/perf-model.md): prefill -32% / -15% / +1%, decode
    +24% / -5% / -0% for 7B / 13B / 70B; the roofline's prefill +15% / +45% / +41%, decode +85% /
    +39% / +21%. Bounds: the operator model within 35% everywhere, nearer than the roofline on every
    decode and on the 13B and 70B prefills; on 7B's prefill it is not (Aladdin's 400 ms is 48% of
    the A100's peak FLOP rate, its 13B figure 61%: an efficiency drop no operator profile shows)."""
    m, hw = load_model(model), load_hardware("dgx-a100")
    ops = OperatorPerfModel(m, hw, tp)
    roof, _ = make_perf_model(m, hw, tp, kind="roofline")
    prefill = (ops.prompt_time(4096) + ops.attention * 4096 ** 2) * 1e3
    decode = ops.token_time(1, 4096) * 1e3
    assert abs(prefill / prefill_ms - 1) < 0.35 and abs(decode / decode_ms - 1) < 0.35, (prefill, decode)
    assert abs(decode / decode_ms - 1) < abs(roof.token_time(1, 4096) * 1e3 / decode_ms - 1)
    assert (abs(prefill / prefill_ms - 1) < abs(roof.prompt_time(4096) * 1e3 / prefill_ms - 1)) == nearer
