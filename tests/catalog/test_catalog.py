"""Catalog: data files load into typed specs; KV sizes and capacities match hand arithmetic."""

import re
from dataclasses import replace
from importlib import resources

import pytest

from splitserve.catalog import (
    HardwareSpec,
    ModelSpec,
    activation_reserve_bytes,
    hardware_names,
    kv_capacity_tokens,
    load_hardware,
    load_model,
    model_names,
)
from splitserve.errors import UserError


def test_names():
    assert hardware_names() == ["dgx-a100", "dgx-h100", "dgx-h100-cap", "dgx-h200", "dgx-l40s"]
    assert model_names() == ["bloom-176b", "codellama-34b", "llama2-13b", "llama2-70b", "llama2-7b", "llama3-70b",
                             "llama3-8b", "mixtral-8x7b", "opt-13b", "opt-175b", "opt-66b"]
    for n in hardware_names():
        assert isinstance(load_hardware(n), HardwareSpec)
    for n in model_names():
        assert isinstance(load_model(n), ModelSpec)


def test_kv_bytes_per_token_by_hand():
    # 2 (K and V) * layers * kv_heads * head_dim * 2 bytes
    assert load_model("llama2-70b").kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert load_model("llama3-70b").kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert load_model("llama3-8b").kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    # BLOOM is multi-head: 112 KV heads
    assert load_model("bloom-176b").kv_bytes_per_token == 2 * 70 * 112 * 128 * 2 == 4_014_080


def test_params_match_shapes():
    # Llama: untied embeddings (2 * vocab * hidden), per layer q/o (hidden^2 each), k/v
    # (hidden * kv_heads * head_dim each), SwiGLU MLP (3 * hidden * intermediate), 2 RMSNorms;
    # plus the final norm.
    for name in ("llama2-70b", "llama3-70b", "llama3-8b", "llama2-7b", "llama2-13b", "codellama-34b"):
        m = load_model(name)
        per_layer = (2 * m.hidden * m.hidden + 2 * m.hidden * m.kv_heads * m.head_dim
                     + 3 * m.hidden * m.intermediate + 2 * m.hidden)
        assert m.params == m.layers * per_layer + 2 * m.vocab * m.hidden + m.hidden
        assert m.weight_bytes == 2 * m.params
        assert m.heads * m.head_dim == m.hidden
    assert load_model("llama2-70b").params == 68_976_648_192
    assert load_model("bloom-176b").params == 176_247_271_424
    assert load_model("llama2-7b").params == 6_738_415_616     # Hugging Face's count for the checkpoint
    assert load_model("llama2-13b").params == 13_015_864_320


def test_opt_params_match_shapes():
    # OPT: per layer q/k/v/o with biases (4 h^2 + 4 h), fc1/fc2 with biases (2 h f + f + h), two
    # LayerNorms with biases (4 h); tied embeddings (vocab x h), 2,050 learned positions, final
    # LayerNorm (2 h)
    for name, billions in (("opt-13b", 13), ("opt-66b", 66), ("opt-175b", 175)):
        m = load_model(name)
        h, f = m.hidden, m.intermediate
        per_layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
        assert m.params == m.layers * per_layer + m.vocab * h + 2050 * h + 2 * h
        assert abs(m.params / 1e9 - billions) / billions < 0.02   # the published size
        assert m.kv_heads == m.heads and m.heads * m.head_dim == h and f == 4 * h


def test_mixtral_params_match_shapes_and_the_published_sizes():
    m = load_model("mixtral-8x7b")
    assert (m.experts, m.experts_per_token, m.intermediate) == (8, 2, 14336)
    h, kvd = m.hidden, m.kv_heads * m.head_dim
    attn = 2 * h * h + 2 * h * kvd                 # q, o; k, v (grouped-query)
    expert = 3 * h * m.intermediate                # one SwiGLU expert of one layer
    per_layer_rest = attn + h * m.experts + 2 * h  # + router (no bias) + 2 RMSNorms
    outside = 2 * m.vocab * h + h                  # untied embeddings, final norm
    total = m.layers * (per_layer_rest + 8 * expert) + outside
    active = m.layers * (per_layer_rest + 2 * expert) + outside
    assert m.params == total == 46_702_792_704
    assert m.active_params == active == 12_879_925_248
    assert m.expert_params == m.layers * 8 * expert and m.params_per_expert == m.layers * expert
    assert m.shared_params == m.layers * per_layer_rest + outside
    # Mistral AI's published 46.7B total and 12.9B active, within 1%
    assert abs(m.params / 46.7e9 - 1) < 0.01
    assert abs(m.active_params / 12.9e9 - 1) < 0.01
    assert m.weight_bytes == 2 * total             # every expert is held
    assert m.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2   # MoE does not change the KV cache


def test_dense_models_have_no_experts():
    for name in model_names():
        m = load_model(name)
        if m.name == "mixtral-8x7b":
            continue
        assert (m.experts, m.experts_per_token, m.is_moe) == (1, 1, False)
        assert m.active_params == m.shared_params == m.params and m.expert_params == 0


def test_moe_fields_are_checked():
    m = load_model("mixtral-8x7b")
    with pytest.raises(ValueError, match="experts_per_token"):
        replace(m, experts_per_token=9)
    with pytest.raises(ValueError, match="experts_per_token"):
        replace(m, experts_per_token=0)
    with pytest.raises(ValueError, match="must exceed"):
        replace(m, params=m.expert_params)         # nothing left for attention and embeddings
    # the twin builds dense specs without knowing their parameter count
    assert replace(load_model("llama2-7b"), params=0).active_params == 0


def test_kv_capacity_counts_every_expert():
    m, hw = load_model("mixtral-8x7b"), load_hardware("dgx-a100")
    usable = 8 * 80e9 * 0.9
    weights = 2 * 46_702_792_704                   # all 8 experts, not the 2 active ones
    # reserve: 32,768 tokens of (2*4096 + (32 + 2*8)*128/8 + 2 experts * 2*14336/8) bf16 values,
    # 8 GPUs: each token's MLP activations in both experts it is routed to
    per_token = (2 * 4096 + 48 * 128 // 8 + 2 * 2 * 14336 // 8) * 2
    reserve = 8 * 32768 * per_token
    assert activation_reserve_bytes(m, 8) == reserve
    expected = int((usable - weights - reserve) // 131_072)
    assert kv_capacity_tokens(m, hw) == expected == 3_617_391


def test_kv_capacity_llama2_70b_dgx_a100_by_hand():
    usable = 8 * 80e9 * 0.9                                   # 576 GB
    weights = 2 * 68_976_648_192                              # 137.95 GB
    # activation reserve: max_context 4096 tokens per GPU of (2*hidden + (64+2*8)*128/8
    # + 2*28672/8) bf16 values, on 8 GPUs
    per_token = (2 * 8192 + 80 * 128 // 8 + 2 * 28672 // 8) * 2   # 49,664 B
    reserve = 8 * 4096 * per_token                            # 1,627,389,952 B
    assert activation_reserve_bytes(load_model("llama2-70b"), 8) == reserve
    expected = int((usable - weights - reserve) // 327_680)
    assert expected == 1_331_846
    got = kv_capacity_tokens(load_model("llama2-70b"), load_hardware("dgx-a100"))
    assert got == expected
    # lower utilisation, fewer tokens; H200's 141 GB holds far more
    assert kv_capacity_tokens(load_model("llama2-70b"), load_hardware("dgx-a100"),
                              memory_utilization=0.8) < got
    assert kv_capacity_tokens(load_model("llama2-70b"), load_hardware("dgx-h200")) > 2 * got


def test_kv_capacity_refuses_weights_that_do_not_fit():
    with pytest.raises(UserError, match="does not fit"):
        kv_capacity_tokens(load_model("bloom-176b"), load_hardware("dgx-a100"), tp=2)
    with pytest.raises(UserError):
        kv_capacity_tokens(load_model("llama2-70b"), load_hardware("dgx-a100"), tp=16)
    with pytest.raises(UserError):
        kv_capacity_tokens(load_model("llama2-70b"), load_hardware("dgx-a100"),
                           memory_utilization=1.5)


def test_hardware_numbers_follow_the_paper():
    a100, h100 = load_hardware("dgx-a100"), load_hardware("dgx-h100")
    cap, h200 = load_hardware("dgx-h100-cap"), load_hardware("dgx-h200")
    assert (a100.cost_per_hour, h100.cost_per_hour, cap.cost_per_hour) == (17.6, 38.0, 38.0)
    # Table V: provisioned power relative to DGX-A100
    assert h100.power_kw / a100.power_kw == pytest.approx(1.75)
    assert cap.power_kw / a100.power_kw == pytest.approx(1.225)
    assert a100.power_kw == pytest.approx(8 * 400 / 1000)
    assert cap.power_cap_frac == 0.5 and cap.machine_power_frac == 0.7
    assert cap.power_cap_w == pytest.approx(8 * 350)
    assert h100.ib_gbs == 2 * a100.ib_gbs == 50.0                  # 400 vs 200 Gbps
    assert (a100.profile_name, h100.profile_name, cap.profile_name, h200.profile_name) == (
        "a100-80gb", "h100-80gb", "h100-80gb-pcap", None)
    assert all(load_hardware(n).gpus == 8 for n in hardware_names())
    assert h200.hbm_gb == 141.0 and h200.hbm_bw_gbs > h100.hbm_bw_gbs


def test_every_hardware_entry_loads_with_its_links():
    for n in hardware_names():
        hw = load_hardware(n)
        assert hw.gpus == 8 and hw.nvlink_latency_s > 0 and hw.nvlink_gbs > 0
        assert hw.link_bytes_per_s == hw.nvlink_gbs * 1e9 / 2     # one direction
        assert hw.power_kw == pytest.approx(hw.gpus * hw.gpu_tdp_w * hw.machine_power_frac / 1e3)
        ref = hw.roofline.fitted_on
        assert ref in ("", "dgx-a100", "dgx-h100")
        if ref:   # borrowed constants: the overheads of the machine they were fitted on
            fitted = load_hardware(ref).roofline
            assert replace(hw.roofline, fitted_on="", prompt_cap_slowdown=1.0) == fitted
    nv = {load_hardware(n).nvlink_latency_s for n in hardware_names() if n != "dgx-l40s"}
    assert nv == {0.47e-6}                                          # NCCL's NVLink ring step
    assert load_hardware("dgx-h200").roofline.fitted_on == "dgx-h100"


def test_l40s_machine():
    l40s, a100 = load_hardware("dgx-l40s"), load_hardware("dgx-a100")
    assert (l40s.gpu, l40s.hbm_gb, l40s.hbm_bw_gbs, l40s.bf16_tflops) == ("L40S-48GB", 48.0, 864.0, 362.05)
    assert l40s.nvlink_gbs == 64.0 and l40s.link_bytes_per_s == 32e9  # PCIe Gen4 x16, each way
    assert l40s.nvlink_latency_s == 1.0e-6                            # NCCL's PCI ring step
    assert l40s.gpu_tdp_w == 350.0 and l40s.power_kw == pytest.approx(2.8)
    assert l40s.cost_per_hour == 8 * 2.25 and l40s.profile_name is None
    assert l40s.roofline.fitted_on == "dgx-a100"
    assert replace(l40s.roofline, fitted_on="") == a100.roofline
    # llama2-70b fits on 8 x 48 GB, with less room for KV than on the A100s
    kv = kv_capacity_tokens(load_model("llama2-70b"), l40s)
    assert 0 < kv < kv_capacity_tokens(load_model("llama2-70b"), a100)


@pytest.mark.parametrize("filename", ["hardware.toml", "models.toml"])
def test_every_number_has_a_source_comment(filename):
    text = resources.files("splitserve.catalog").joinpath(filename).read_text()
    numeric = re.compile(r"^\s*\w+\s*=\s*[-+0-9.eE_]+\s*(#.*)?$")
    lines = [ln for ln in text.splitlines() if numeric.match(ln)]
    assert lines
    missing = [ln for ln in lines if "#" not in ln]
    assert not missing, missing


def test_unknown_names_are_user_errors_listing_valid_names():
    with pytest.raises(UserError) as e:
        load_hardware("dgx-b200")
    msg = str(e.value)
    assert "\n" not in msg and "dgx-a100" in msg and "dgx-h200" in msg
    with pytest.raises(UserError) as e:
        load_model("gpt-5")
    msg = str(e.value)
    assert "\n" not in msg and "llama2-70b" in msg and "bloom-176b" in msg


def test_specs_are_frozen():
    m = load_model("llama2-70b")
    with pytest.raises(AttributeError):
        m.layers = 1  # type: ignore[misc]
