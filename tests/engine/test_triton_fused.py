"""The fused elementwise Triton kernels (engine/triton_fused.py) against the torch ops they replace
in model.py and attention.py, float32 and bfloat16, and a whole model run on them: greedy tokens
equal to the torch kernels'. On CPU the kernels run in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_setup import device

DEV = device()  # before triton is imported

from splitserve.engine.attention import write_kv  # noqa: E402
from splitserve.engine.engine import EngineConfig, LLMEngine  # noqa: E402
from splitserve.engine.kernels import select_kernels  # noqa: E402
from splitserve.engine.model import RMSNorm, Rotary, apply_rotary  # noqa: E402
from splitserve.engine.presets import get_preset  # noqa: E402
from splitserve.engine.sampler import SamplingParams  # noqa: E402
from splitserve.engine.triton_fused import rms_norm, rotary_, silu_mul  # noqa: E402
from splitserve.engine.triton_fused import write_kv as triton_write_kv  # noqa: E402

DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
# float32: a few units in the last place (summation order, exp); bfloat16: one step of its 8 bits,
# which a rounding boundary between two float32 results of different order can cost
TOL = {torch.float32: dict(rtol=1e-6, atol=1e-6), torch.bfloat16: dict(rtol=2 ** -7, atol=1e-6)}


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=DEV)


@DTYPES
def test_rms_norm_with_the_residual_equals_add_then_rmsnorm(dtype):
    gen = torch.Generator().manual_seed(0)
    x, r = randn(gen, 7, 96, dtype=dtype), randn(gen, 7, 96, dtype=dtype)
    norm = RMSNorm(96, 1e-5).to(dtype=dtype, device=DEV)
    norm.weight.data = randn(gen, 96, dtype=dtype)
    y, s = rms_norm(x, norm.weight, norm.eps, r)
    assert torch.equal(s, x + r)  # the residual stream: bit for bit
    torch.testing.assert_close(y, norm(x + r), **TOL[dtype])
    y0, s0 = rms_norm(x, norm.weight, norm.eps)
    assert s0 is x
    torch.testing.assert_close(y0, norm(x), **TOL[dtype])


@DTYPES
def test_rotary_in_place_equals_apply_rotary_and_leaves_v(dtype):
    cfg = get_preset("tiny")
    nh, kvh, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    rot = Rotary(cfg, 512)
    rot.build(DEV)
    gen = torch.Generator().manual_seed(1)
    qkv = randn(gen, 9, (nh + 2 * kvh) * hd, dtype=dtype)
    positions = torch.tensor([0, 1, 2, 17, 100, 255, 256, 300, 511], device=DEV)
    cos, sin = rot.lookup(positions)
    q, k, v = qkv.split([nh * hd, kvh * hd, kvh * hd], -1)
    want_q, want_k = apply_rotary(q.view(9, nh, hd), cos, sin), apply_rotary(k.view(9, kvh, hd), cos, sin)
    want_v = v.clone()
    rotary_(qkv, positions, rot.cos, rot.sin, nh + kvh, hd)
    torch.testing.assert_close(q.view(9, nh, hd), want_q, **TOL[dtype])
    torch.testing.assert_close(k.view(9, kvh, hd), want_k, **TOL[dtype])
    assert torch.equal(v, want_v)


@DTYPES
def test_silu_mul_equals_silu_gate_times_up(dtype):
    gen = torch.Generator().manual_seed(2)
    gate_up = randn(gen, 5, 2 * 1300, dtype=dtype) * 4  # 1300 columns: two column blocks, the last partial
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(silu_mul(gate_up), F.silu(gate) * up, **TOL[dtype])


@DTYPES
def test_write_kv_from_a_fused_qkv_view_equals_the_indexed_write(dtype):
    gen = torch.Generator().manual_seed(3)
    nh, kvh, hd, bs = 4, 2, 16, 4
    qkv = randn(gen, 6, (nh + 2 * kvh) * hd, dtype=dtype)
    _, k, v = qkv.split([nh * hd, kvh * hd, kvh * hd], -1)
    k, v = k.view(6, kvh, hd), v.view(6, kvh, hd)  # strided views, as the model hands them over
    caches = [torch.zeros(9, bs, kvh, hd, dtype=dtype, device=DEV) for _ in range(4)]
    slots = torch.tensor([3, 7, 30, 12, 0, 32], device=DEV)  # 32: the null block's first slot
    write_kv(k, v, caches[0], caches[1], slots)
    triton_write_kv(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])
    assert caches[2].count_nonzero() == 6 * kvh * hd


PROMPTS = [[1] + [(13 * i + j) % 250 + 3 for j in range(n)] for i, n in enumerate([1, 19, 6])]


def run_with_a_late_prompt(eng: LLMEngine) -> tuple[dict[str, list], list[list[tuple[int, int]]]]:
    """PROMPTS at once; two steps later, while they decode, a prompt whose first 20 tokens are
    PROMPTS[1]'s (cached). Each request's outputs, and every step's (KV before, tokens) shapes."""
    params = SamplingParams(max_tokens=6, ignore_eos=True, return_logits=True)
    outs: dict[str, list] = {}
    shapes = []
    for i, p in enumerate(PROMPTS):
        eng.add_request(p, params, str(i))
    while eng.has_unfinished():
        if len(shapes) == 2:
            eng.add_request(PROMPTS[1] + [7, 8, 9], params, "late")
        for o in eng.step():
            outs.setdefault(o.request_id, []).append(o)
        shapes.append(eng.last_shape)
    return outs, shapes


def test_a_model_on_the_triton_kernels_makes_the_torch_kernels_tokens():
    """tiny, float32, blocks of 4 tokens, through the Triton kernels: prompts, batched decodes,
    then a step of decodes with a prompt after 20 cached tokens (the decode kernel on the first
    rows, the packed prefill kernel on the rest) give the torch path's greedy tokens and logits."""
    runs = {}
    for kernels in ("torch", "triton"):
        eng = LLMEngine("tiny", EngineConfig(device=DEV, dtype="float32", kernels=kernels, block_size=4))
        assert (eng.model.kernels is None) == (kernels == "torch")
        runs[kernels] = run_with_a_late_prompt(eng)
    (ref, _), (out, shapes) = runs["torch"], runs["triton"]
    assert (20, 3) in shapes[2] and sum(n == 1 for _, n in shapes[2]) == 3  # a mixed step: 3 decodes + the late prompt
    assert out.keys() == ref.keys() == {"0", "1", "2", "late"}
    for rid, r in ref.items():
        assert out[rid][-1].token_ids == r[-1].token_ids
        torch.testing.assert_close(torch.stack(out[rid][-1].logits), torch.stack(r[-1].logits), rtol=0, atol=1e-4)


def test_auto_picks_triton_only_on_cuda():
    assert select_kernels("auto", torch.device("cpu")) is None
    assert select_kernels("torch", DEV) is None
    assert (select_kernels("auto", DEV) is None) == (DEV.type == "cpu")
