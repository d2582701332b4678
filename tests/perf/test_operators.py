"""The operator model (perf/operators.py): committed coefficients against Vidur's measured rows."""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

import pytest

from splitserve.errors import UserError
from splitserve.perf.operators import LAYER_OPS, LayerShape, load

ROOT = Path(__file__).resolve().parents[2]
VIDUR = ROOT.parent / "shared" / "profiles" / "vidur"

LLAMA2_7B = LayerShape(32, 32, 4096, 11008)
LLAMA2_70B = LayerShape(64, 8, 8192, 28672)
INTERNLM_20B = LayerShape(40, 40, 5120, 13824)
QWEN_72B = LayerShape(64, 64, 8192, 24576)

# (gpu, shape, tp, tokens, measured sum of the layer's non-attention operators in ms (Vidur
# mlp.csv medians, commit 7d47513), bound in %). Decode (1 token) is launch-bound and looser.
LAYER_ROWS = [
    ("a100", LLAMA2_70B, 8, 1024, 1.155, 10),
    ("a100", LLAMA2_7B, 1, 4096, 8.1705, 10),
    ("a100", LLAMA2_7B, 2, 256, 0.330, 10),
    ("a100", INTERNLM_20B, 4, 64, 0.151, 10),
    ("a100", QWEN_72B, 4, 2048, 4.293, 10),
    ("a100", LLAMA2_70B, 8, 1, 0.177, 25),
    ("h100", LLAMA2_70B, 8, 1024, 0.408, 10),
    ("h100", LLAMA2_7B, 1, 4096, 2.592, 10),
    ("h100", INTERNLM_20B, 4, 64, 0.090, 10),
    ("h100", QWEN_72B, 4, 2048, 1.5115, 10),
    ("h100", LLAMA2_70B, 8, 1, 0.1045, 10),
]


@pytest.mark.parametrize("gpu,shape,tp,tokens,measured,bound", LAYER_ROWS)
def test_committed_coefficients_reproduce_profiled_layers(gpu, shape, tp, tokens, measured, bound):
    pred = load().layer_compute_ms(gpu, shape, tp, tokens)
    assert abs(pred - measured) / measured * 100 <= bound, (pred, measured)


def test_single_operators_reproduce_profiled_rows():
    m = load()
    # mlp_up_proj medians (ms): A100 Llama-2-70B tp 8 at 1024 tokens, H100 Llama-2-7B tp 1 at 4096
    assert m.op_ms("a100", "mlp_up_proj", LLAMA2_70B, 8, 1024) == pytest.approx(0.543, rel=0.05)
    assert m.op_ms("h100", "mlp_up_proj", LLAMA2_7B, 1, 4096) == pytest.approx(0.987, rel=0.05)


@pytest.mark.parametrize("gpu", ["a100", "h100"])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_predictions_are_monotone_in_tokens(gpu, tp):
    m = load()
    for shape in (LLAMA2_7B, LLAMA2_70B, QWEN_72B):
        for op in LAYER_OPS:
            prev = 0.0
            for tokens in range(1, 8193, 7):
                t = m.op_ms(gpu, op, shape, tp, tokens)
                assert t >= prev and t > 0, (op, tokens, t, prev)
                prev = t
        layer = [m.layer_ms(gpu, shape, tp, n) for n in (1, 16, 256, 4096)]
        assert layer == sorted(layer)


def test_layer_adds_two_all_reduces_when_tp_above_one():
    m = load()
    compute = m.layer_compute_ms("h100", LLAMA2_70B, 4, 512)
    ar = m.all_reduce_ms("h100", 4, 512 * 8192)
    assert ar > 0 and m.layer_ms("h100", LLAMA2_70B, 4, 512) == pytest.approx(compute + 2 * ar)
    assert m.layer_ms("h100", LLAMA2_70B, 1, 512) == pytest.approx(m.layer_compute_ms("h100", LLAMA2_70B, 1, 512))


def test_unknown_gpu_and_operator_are_user_errors():
    with pytest.raises(UserError, match="no operator model"):
        load().op_ms("v100", "add", LLAMA2_7B, 1, 8)
    with pytest.raises(UserError, match="unknown operator"):
        load().op_ms("a100", "attention", LLAMA2_7B, 1, 8)


@pytest.mark.skipif(not (VIDUR / "compute").is_dir(), reason="Vidur profiles not at ../shared/profiles/vidur")
@pytest.mark.parametrize("gpu,model", [("a100", "Llama-2-70b-hf"), ("h100", "Llama-2-7b-hf")])
def test_held_out_model_whole_layer_median_error_within_10_percent(gpu, model):
    spec = importlib.util.spec_from_file_location("fit_operator_model", ROOT / "scripts" / "fit_operator_model.py")
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)
    res = fit.lomo(VIDUR, gpu, only=model)
    assert len(res) > 900
    assert statistics.median(r["layer_err"] for r in res) <= 10.0
