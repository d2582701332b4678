"""RooflinePerfModel and AnalyticalPowerModel: hand-computed values, the documented error bound
against the Splitwise profile, monotonicity, and power caps."""

import statistics
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.catalog import hardware_names, load_hardware, load_model, model_names
from splitserve.errors import UserError
from splitserve.perf.power import AnalyticalPowerModel
from splitserve.perf.profile import read_profile_rows
from splitserve.perf.roofline import RooflinePerfModel

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO.parent / "shared" / "profiles" / "splitwise_a100_h100_perf_model.csv"

# The bounds documented in docs/perf-model.md (measured: see the table there).
BOUNDS = {  # (model, hardware): (prompt MAPE, token MAPE), fractions
    ("llama2-70b", "dgx-a100"): (0.12, 0.07),
    ("llama2-70b", "dgx-h100"): (0.15, 0.05),
    ("llama2-70b", "dgx-h100-cap"): (0.15, 0.05),
    ("bloom-176b", "dgx-a100"): (0.17, 0.10),
    ("bloom-176b", "dgx-h100"): (0.13, 0.05),
}


def test_hand_computed_decode_and_prompt():
    m, hw = load_model("llama2-70b"), load_hardware("dgx-a100")
    c = hw.roofline
    pm = RooflinePerfModel(m, hw)
    # decode, batch 4 with 4000 KV tokens: memory bound
    weights = 2 * 68_976_648_192
    kv = 4000 * 327_680
    mem = (weights + kv) / (8 * 2039e9 * c.mbu)
    comp = (2 * 68_976_648_192 * 4 + 4 * 80 * 64 * 128 * 4000) / (8 * 312e12 * c.mfu)
    assert mem > comp
    expected = 80 * (c.token_layer_overhead_s + 4 * c.token_seq_layer_overhead_s) + mem
    assert pm.token_time(4, 4000) == pytest.approx(expected, rel=1e-12)
    # prompt of 2048 tokens: compute bound with the batch-dependent MFU
    t = 2048
    flops = 2 * 68_976_648_192 * t + 2 * 80 * 64 * 128 * t * t
    inv_mfu = 1 / c.mfu + (1 / c.mfu_large - 1 / c.mfu) * t / (t + c.mfu_knee_tokens)
    comp = flops * inv_mfu / (8 * 312e12)
    mem = (weights + t * 327_680) / (8 * 2039e9 * c.mbu)
    assert comp > mem
    assert pm.prompt_time(t) == pytest.approx(80 * c.prompt_layer_overhead_s + comp, rel=1e-12)
    assert pm.mixed_time(t, 4, 4000) == pytest.approx(max(pm.prompt_time(t + 4),
                                                          pm.token_time(4, 4000)), rel=1e-12)
    assert pm.prompt_time(0) == 0.0 and pm.token_time(0, 0) == 0.0 and pm.mixed_time(0, 0, 0) == 0.0
    assert pm.source == "roofline"


def test_power_cap_slows_prompts_only():
    m = load_model("llama2-70b")
    h = RooflinePerfModel(m, load_hardware("dgx-h100"))
    cap = RooflinePerfModel(m, load_hardware("dgx-h100-cap"))
    for t in (128, 1024, 8192):
        assert cap.prompt_time(t) == pytest.approx(1.3 * h.prompt_time(t), rel=1e-12)
    for b, c in ((1, 500), (64, 64 * 2000)):
        assert cap.token_time(b, c) == h.token_time(b, c)


def test_h200_decodes_faster_than_h100():
    m = load_model("llama2-70b")
    h100 = RooflinePerfModel(m, load_hardware("dgx-h100"))
    h200 = RooflinePerfModel(m, load_hardware("dgx-h200"))
    assert h200.token_time(64, 64 * 2000) < h100.token_time(64, 64 * 2000)


def test_bad_inputs():
    m, hw = load_model("llama2-70b"), load_hardware("dgx-a100")
    with pytest.raises(UserError):
        RooflinePerfModel(m, hw, tp=0)
    with pytest.raises(UserError):
        RooflinePerfModel(m, hw, calibration=replace(hw.roofline, mbu=0.0))


# ----------------------------------------------------------------------------- vs the profile


def _profile_points(model, hw_name):
    """Medians of the profile per batched prompt tokens, per batch size (at 576 tokens of
    context per request) and per batch-1 mean context (prompt + generated / 2)."""
    rows = read_profile_rows(PROFILE, model, load_hardware(hw_name).profile_name, 8)
    prompt, batch, ctx = defaultdict(list), defaultdict(list), defaultdict(list)
    for r in rows:
        prompt[r["batch_size"] * r["prompt_size"]].append(r["prompt_time"] / 1e3)
        if r["prompt_size"] == 512 and r["token_size"] == 128:
            batch[r["batch_size"]].append(r["token_time"] / 1e3)
        elif r["batch_size"] == 1:
            ctx[r["prompt_size"] + r["token_size"] / 2].append(r["token_time"] / 1e3)
    med = statistics.median
    tokens = [(b, b * 576, med(v)) for b, v in batch.items()]
    tokens += [(1, int(x), med(v)) for x, v in ctx.items()]
    return [(t, med(v)) for t, v in prompt.items()], tokens


@pytest.mark.parametrize("model,hw_name", sorted(BOUNDS))
def test_within_documented_error_of_profile(model, hw_name):
    if not PROFILE.exists():
        pytest.skip(f"Splitwise profile not found at {PROFILE}")
    prompt, tokens = _profile_points(model, hw_name)
    assert len(prompt) == 9 and len(tokens) == 19
    pm = RooflinePerfModel(load_model(model), load_hardware(hw_name), 8)
    p_mape = statistics.mean(abs(pm.prompt_time(t) / y - 1) for t, y in prompt)
    t_mape = statistics.mean(abs(pm.token_time(b, c) / y - 1) for b, c, y in tokens)
    p_bound, t_bound = BOUNDS[(model, hw_name)]
    assert p_mape < p_bound, f"prompt MAPE {p_mape:.3f}"
    assert t_mape < t_bound, f"token MAPE {t_mape:.3f}"
    # and never wildly off at any single point
    assert max(abs(pm.prompt_time(t) / y - 1) for t, y in prompt) < 0.45
    assert max(abs(pm.token_time(b, c) / y - 1) for b, c, y in tokens) < 0.15


# ----------------------------------------------------------------------------- properties

ALL = [(m, h) for m in model_names() for h in hardware_names()]


@settings(max_examples=300, deadline=None)
@given(i=st.integers(0, len(ALL) - 1), t=st.integers(1, 200_000), d=st.integers(0, 50_000),
       b=st.integers(1, 1000), db=st.integers(0, 200), c=st.integers(0, 2_000_000),
       dc=st.integers(0, 200_000))
def test_monotone(i, t, d, b, db, c, dc):
    m, h = ALL[i]
    pm = RooflinePerfModel(load_model(m), load_hardware(h))
    assert 0 < pm.prompt_time(t) <= pm.prompt_time(t + d)
    assert 0 < pm.token_time(b, c) <= pm.token_time(b, c + dc)
    assert pm.token_time(b, c) <= pm.token_time(b + db, c)
    assert pm.mixed_time(t, b, c) >= max(pm.prompt_time(t), pm.token_time(b, c))


@settings(max_examples=200, deadline=None)
@given(h=st.sampled_from(hardware_names()), tp=st.sampled_from([1, 2, 4, 8]),
       t=st.integers(0, 10**6), b=st.integers(0, 10**4))
def test_power_never_exceeds_cap(h, tp, t, b):
    hw = load_hardware(h)
    pw = AnalyticalPowerModel(hw, tp)
    limit = hw.power_cap_frac * hw.gpu_tdp_w * hw.gpus
    for w in (pw.prompt_power_w(t), pw.token_power_w(b), pw.idle_power_w()):
        assert 0 < w <= limit + 1e-9


def test_power_shapes_and_capped_draws_less():
    h100 = AnalyticalPowerModel(load_hardware("dgx-h100"))
    cap = AnalyticalPowerModel(load_hardware("dgx-h100-cap"))
    # prompt power rises with batch tokens toward TDP; token power is flat; idle is lowest
    p = [h100.prompt_power_w(t) for t in (64, 512, 2048, 8192)]
    assert p == sorted(p) and p[-1] == pytest.approx(8 * 700, rel=1e-3)
    assert h100.token_power_w(1) == h100.token_power_w(64) == pytest.approx(0.65 * 8 * 700)
    assert h100.idle_power_w() == pytest.approx(0.2 * 8 * 700)
    assert h100.idle_power_w() < h100.token_power_w(1) < h100.prompt_power_w(8192)
    for t in (256, 2048, 8192):
        assert cap.prompt_power_w(t) < h100.prompt_power_w(t)
        assert cap.prompt_power_w(t) <= 0.5 * 8 * 700
    for b in (1, 16, 64):
        assert cap.token_power_w(b) < h100.token_power_w(b)
    # tp 2 on an 8-GPU machine: 2 busy GPUs, 6 idle ones
    tp2 = AnalyticalPowerModel(load_hardware("dgx-a100"), 2)
    assert tp2.token_power_w(8) == pytest.approx(0.65 * 400 * 2 + 0.2 * 400 * 6)
