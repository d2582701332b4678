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


class _RooflineBeforeComm:
    """The roofline as it was before the all-reduce and MoE terms (dense models, tp 8), kept
    operation for operation, to show that tp 8 predictions did not move by a single bit."""

    def __init__(self, model, hw):
        c, tp = hw.roofline, 8
        peak = tp * hw.bf16_tflops * 1e12
        bw = tp * hw.hbm_bw_gbs * 1e9 * c.mbu
        attn = model.layers * model.heads * model.head_dim
        w, kv = float(model.weight_bytes), float(model.kv_bytes_per_token)
        self.s_cap, self.o_p = c.prompt_cap_slowdown, model.layers * c.prompt_layer_overhead_s
        self.pa1, self.pa2 = 2.0 * model.params / peak, 2.0 * attn / peak
        self.inv_mfu, self.inv_drop = 1.0 / c.mfu, 1.0 / c.mfu_large - 1.0 / c.mfu
        self.knee, self.pm0, self.pm1 = c.mfu_knee_tokens, w / bw, kv / bw
        self.o_t = model.layers * c.token_layer_overhead_s
        self.o_seq = model.layers * c.token_seq_layer_overhead_s
        self.da1, self.da2 = 2.0 * model.params / (peak * c.mfu), 4.0 * attn / (peak * c.mfu)
        self.dm0, self.dm1 = w / bw, kv / bw

    def prompt_time(self, tokens):
        comp = (self.pa1 + self.pa2 * tokens) * tokens * (
            self.inv_mfu + self.inv_drop * tokens / (tokens + self.knee))
        mem = self.pm0 + self.pm1 * tokens
        return max(self.s_cap * (self.o_p + (comp if comp > mem else mem)), 1e-5)

    def token_time(self, batch, context):
        comp = self.da1 * batch + self.da2 * context
        mem = self.dm0 + self.dm1 * context
        return max(self.o_t + self.o_seq * batch + (comp if comp > mem else mem), 1e-5)


NVLINK_MACHINES = ["dgx-a100", "dgx-h100", "dgx-h100-cap", "dgx-h200"]


@pytest.mark.parametrize("hw_name", NVLINK_MACHINES)
def test_tp8_predictions_unchanged_exactly(hw_name):
    hw = load_hardware(hw_name)
    for name in model_names():
        m = load_model(name)
        if m.is_moe:
            continue
        new, old = RooflinePerfModel(m, hw, 8), _RooflineBeforeComm(m, hw)
        assert new.comm_time(0) == 0.0 and new.comm_time(10**6) == 0.0
        for t in (1, 7, 128, 512, 2048, 2049, 8192, 32768, 200_000):
            assert new.prompt_time(t) == old.prompt_time(t)
        for b, c in ((1, 0), (1, 500), (4, 4000), (16, 16 * 576), (64, 64 * 2000), (1000, 10**6)):
            assert new.token_time(b, c) == old.token_time(b, c)
            assert new.mixed_time(512, b, c) == max(old.prompt_time(512 + b), old.token_time(b, c))


def test_tp4_allreduce_difference_by_hand():
    m, hw = load_model("llama2-70b"), load_hardware("dgx-a100")
    c = hw.roofline
    pm4, pm8 = RooflinePerfModel(m, hw, 4), RooflinePerfModel(m, hw, 8)
    # decode of 16 requests: 2 all-reduces per layer of 16 * 8192 * 2 B = 262,144 B, ring over
    # NVLink at 300 GB/s each way, 0.47 us per step
    ar4 = 2 * 3 * 0.47e-6 + 2 * 3 / 4 * 262_144 / 300e9      # 4.13072 us
    ar8 = 2 * 7 * 0.47e-6 + 2 * 7 / 8 * 262_144 / 300e9      # 8.10917 us
    diff = 80 * 2 * (ar4 - ar8)
    assert diff == pytest.approx(-6.36552e-4, rel=1e-5)
    assert pm4.comm_time(16) == pytest.approx(diff, rel=1e-12)
    assert pm8.comm_time(16) == 0.0
    # the whole tp-4 decode: 4 GPUs of compute and bandwidth, the fitted overheads, the difference
    mem = (2 * 68_976_648_192 + 16 * 576 * 327_680) / (4 * 2039e9 * c.mbu)
    comp = (2 * 68_976_648_192 * 16 + 4 * 80 * 64 * 128 * 16 * 576) / (4 * 312e12 * c.mfu)
    assert mem > comp
    expected = 80 * (c.token_layer_overhead_s + 16 * c.token_seq_layer_overhead_s) + diff + mem
    assert pm4.token_time(16, 16 * 576) == pytest.approx(expected, rel=1e-12)
    # a compute-bound 2048-token prefill at tp 4: the per-token saving comes off the compute side
    t = 2048
    ar4p = 2 * 3 / 4 * t * 8192 * 2 / 300e9
    ar8p = 2 * 7 / 8 * t * 8192 * 2 / 300e9
    fixed = 80 * 2 * (2 * 3 * 0.47e-6 - 2 * 7 * 0.47e-6)
    inv_mfu = 1 / c.mfu + (1 / c.mfu_large - 1 / c.mfu) * t / (t + c.mfu_knee_tokens)
    comp = (2 * 68_976_648_192 * t + 2 * 80 * 64 * 128 * t * t) * inv_mfu / (4 * 312e12)
    assert pm4.comm_time(t) == pytest.approx(fixed + 80 * 2 * (ar4p - ar8p), rel=1e-12)
    assert pm4.prompt_time(t) == pytest.approx(
        80 * c.prompt_layer_overhead_s + fixed + comp + 80 * 2 * (ar4p - ar8p), rel=1e-12)
    # tp 1: no all-reduce at all, so the whole fitted tp-8 all-reduce comes off
    pm1 = RooflinePerfModel(m, hw, 1)
    assert pm1.comm_time(16) == pytest.approx(-80 * 2 * ar8, rel=1e-12)


def test_expert_parallel_alltoall_by_hand():
    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    pm = RooflinePerfModel(m, hw, 8, ep=8)
    # a 1024-token prefill: attention all-reduce of 1024 * 4096 * 2 B = 8,388,608 B; the MLP's
    # all-reduce becomes two all-to-alls of 1024 * 2 (top-2) * 8192 B * 7/8 = 14,680,064 B each
    ar = 2 * 7 * 0.47e-6 + 2 * 7 / 8 * 8_388_608 / 450e9     # 39.20222 us
    a2a = 7 * 0.47e-6 + 14_680_064 / 450e9                   # 35.91236 us
    # (2 a2a - ar = 32.62236 us per layer)
    diff = 32 * (ar + 2 * a2a - 2 * ar)                      # the fit holds 2 all-reduces
    assert diff == pytest.approx(1.0439157e-3, rel=1e-6)
    assert pm.comm_time(1024) == pytest.approx(diff, rel=1e-12)
    c = hw.roofline
    base = RooflinePerfModel(m, hw, 8)                       # ep 1: the fitted all-reduces
    assert base.comm_time(1024) == 0.0
    assert pm.prompt_time(1024) == pytest.approx(base.prompt_time(1024) + c.prompt_cap_slowdown * diff,
                                                 rel=1e-12)
    # tp = ep = 2 on the same machine: one all-reduce and two all-to-alls over 2 GPUs, half the
    # tokens' expert copies cross; the fit's two tp-8 all-reduces come off
    pm2 = RooflinePerfModel(m, hw, 2, ep=2)
    ar2 = 2 * 1 * 0.47e-6 + 2 * 1 / 2 * 8_388_608 / 450e9
    a2a2 = 1 * 0.47e-6 + 1024 * 2 * 8192 / 2 / 450e9
    assert pm2.comm_time(1024) == pytest.approx(32 * (ar2 + 2 * a2a2 - 2 * ar), rel=1e-12)


def test_expert_parallel_is_checked():
    hw = load_hardware("dgx-h100")
    with pytest.raises(UserError, match="expert parallel"):
        RooflinePerfModel(load_model("llama2-70b"), hw, 8, ep=2)      # dense
    with pytest.raises(UserError, match="expert parallel"):
        RooflinePerfModel(load_model("mixtral-8x7b"), hw, 4, ep=8)    # ep > tp
    with pytest.raises(UserError, match="expert parallel"):
        RooflinePerfModel(load_model("mixtral-8x7b"), hw, 8, ep=2)    # ep < tp: not modelled
    with pytest.raises(UserError, match="expert parallel"):
        RooflinePerfModel(load_model("mixtral-8x7b"), hw, 6, ep=6)    # 6 does not divide 8 experts
    assert RooflinePerfModel(load_model("mixtral-8x7b"), hw, 4, ep=4).ep == 4


def test_moe_decode_reads_the_experts_it_touches():
    moe, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    dense = replace(moe, experts=1, experts_per_token=1)    # same 46.7B weights, all dense
    pm, pd = RooflinePerfModel(moe, hw), RooflinePerfModel(dense, hw)
    per_expert_layer = 3 * 4096 * 14336                      # params of one expert in one layer
    shared = moe.params - 32 * 8 * per_expert_layer
    for b in (1, 2, 4, 16, 64):
        experts_touched = 8 * (1 - (1 - 2 / 8) ** b)        # expected distinct experts per layer
        want = 2 * (shared + 32 * experts_touched * per_expert_layer) + 1000 * 131_072
        assert pm.decode_bytes(b, 1000) == pytest.approx(want, rel=1e-12)
        assert pd.decode_bytes(b, 1000) == 2 * moe.params + 1000 * 131_072
    # batch 1 reads exactly the 2 active experts: the active parameters, 28% of the dense read
    assert pm.decode_bytes(1, 0) == pytest.approx(2 * moe.active_params, rel=1e-12)
    assert pm.decode_bytes(1, 0) < 0.3 * pd.decode_bytes(1, 0)
    # batch 4 touches 5.47 of 8 experts per layer; batch 64 all but 1e-8 of them
    assert pm.decode_bytes(4, 0) == pytest.approx(2 * (shared + 32 * 5.46875 * per_expert_layer))
    assert pm.decode_bytes(64, 0) == pytest.approx(2 * moe.params, rel=1e-8)
    assert pm.decode_bytes(64, 0) < pd.decode_bytes(64, 0)
    # token time: memory bound at small batch, with the active parameters' FLOPs
    c = hw.roofline
    mem = pm.decode_bytes(4, 4000) / (8 * 3355e9 * c.mbu)
    comp = (2 * moe.active_params * 4 + 4 * 32 * 32 * 128 * 4000) / (8 * 989e12 * c.mfu)
    assert mem > comp
    o = 32 * (c.token_layer_overhead_s + 4 * c.token_seq_layer_overhead_s)
    assert pm.token_time(4, 4000) == pytest.approx(o + mem, rel=1e-12)
    assert pm.token_time(1, 1000) < pd.token_time(1, 1000)
    # prefill: every weight read once, FLOPs of the active parameters only
    t = 4096
    inv_mfu = 1 / c.mfu + (1 / c.mfu_large - 1 / c.mfu) * t / (t + c.mfu_knee_tokens)
    flops = 2 * moe.active_params * t + 2 * 32 * 32 * 128 * t * t
    assert pm.prompt_time(t) == pytest.approx(32 * c.prompt_layer_overhead_s
                                              + flops * inv_mfu / (8 * 989e12), rel=1e-12)
    assert pm.prompt_time(t) < pd.prompt_time(t)
    # and KV capacity does not care: the same KV bytes per token
    assert moe.kv_bytes_per_token == dense.kv_bytes_per_token


def test_pcie_machine_pays_for_its_allreduces():
    # dgx-l40s borrows dgx-a100's overheads, which hold NVLink all-reduces; over PCIe they cost more
    m = load_model("llama2-70b")
    l40s, a100 = load_hardware("dgx-l40s"), load_hardware("dgx-a100")
    pm = RooflinePerfModel(m, l40s)
    x = 2048 * 8192 * 2
    ar_pcie = 2 * 7 * 1.0e-6 + 2 * 7 / 8 * x / 32e9
    ar_nvl = 2 * 7 * 0.47e-6 + 2 * 7 / 8 * x / 300e9
    assert pm.comm_time(2048) == pytest.approx(80 * 2 * (ar_pcie - ar_nvl), rel=1e-12)
    assert pm.comm_time(2048) > 0.2                          # 0.24 s on a 2048-token prefill
    assert pm.prompt_time(2048) > RooflinePerfModel(m, a100).prompt_time(2048)


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


@settings(max_examples=300, deadline=None)
@given(m=st.sampled_from(["llama2-70b", "llama3-8b", "mixtral-8x7b", "bloom-176b"]),
       h=st.sampled_from(hardware_names()), tp=st.sampled_from([1, 2, 4, 8]),
       ep=st.sampled_from([1, 2, 4, 8]), t=st.integers(1, 200_000), d=st.integers(0, 50_000),
       b=st.integers(1, 1000), db=st.integers(0, 200), c=st.integers(0, 2_000_000),
       dc=st.integers(0, 200_000))
def test_monotone_at_any_tp_and_ep(m, h, tp, ep, t, d, b, db, c, dc):
    model = load_model(m)
    if ep != tp or not model.is_moe:
        ep = 1
    pm = RooflinePerfModel(model, load_hardware(h), tp, ep=ep)
    assert 0 < pm.prompt_time(t) <= pm.prompt_time(t + d)
    assert 0 < pm.token_time(b, c) <= pm.token_time(b, c + dc)
    assert pm.token_time(b, c) <= pm.token_time(b + db, c)


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
