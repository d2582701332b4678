"""Catalog: data files load into typed specs; KV sizes and capacities match hand arithmetic."""

import re
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
    assert hardware_names() == ["dgx-a100", "dgx-h100", "dgx-h100-cap", "dgx-h200"]
    assert model_names() == ["bloom-176b", "codellama-34b", "llama2-13b", "llama2-70b", "llama2-7b", "llama3-70b",
                             "llama3-8b", "opt-13b", "opt-175b", "opt-66b"]
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
