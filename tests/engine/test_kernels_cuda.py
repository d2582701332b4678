"""The Triton kernels on a GPU (issue 46): greedy tokens equal the torch reference path's at batch 1
and 64, and every prefill shape stays on SDPA's flash backend or the packed Triton kernel.
Skipped without CUDA (their CPU counterparts, in Triton's interpreter: test_triton_*.py)."""

from __future__ import annotations

from importlib.util import find_spec

import pytest
import torch

from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.sampler import SamplingParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the Triton kernels compiled for a GPU"),
              pytest.mark.skipif(find_spec("triton") is None, reason="triton is not installed: the Triton kernels cannot run")]

# 64 prompts of 1-300 tokens (decode contexts past one split of 64 positions and many blocks)
PROMPTS = [[1] + [(17 * i + 5 * j) % 30000 + 3 for j in range((37 * i) % 300)] for i in range(64)]
GREEDY = SamplingParams(max_tokens=32, ignore_eos=True, return_logits=True)
NEAR_TIE = 1e-3  # logits this close may order differently under another summation order


def greedy(kernels: str, prompts: list[list[int]], batch: int, graphs: bool) -> list:
    eng = LLMEngine("small", EngineConfig(device="cuda", dtype="float32", kernels=kernels, max_num_seqs=batch,
                                          cuda_graphs=graphs))
    assert (eng.model.kernels is not None) == (kernels == "triton")
    return eng.generate(prompts, GREEDY)


def same_greedy(ref: list, out: list) -> int:
    """Asserts each output's tokens equal the reference's, but where the reference's own top two
    logits were a near tie (then the rest of that sequence may differ); the near ties seen."""
    ties = 0
    for r, o in zip(ref, out):
        if r.token_ids == o.token_ids:
            continue
        i = next(i for i, (a, b) in enumerate(zip(r.token_ids, o.token_ids)) if a != b)
        gap = (r.logits[i][r.token_ids[i]] - r.logits[i][o.token_ids[i]]).item()
        assert gap < NEAR_TIE, f"token {i} differs: {r.token_ids[i]} vs {o.token_ids[i]}, logit gap {gap}"
        ties += 1
    return ties


@pytest.mark.parametrize("batch", [1, 64])
def test_triton_kernels_with_cuda_graphs_make_the_reference_tokens(batch):
    prompts = PROMPTS[:20] if batch == 1 else PROMPTS
    ref = greedy("torch", prompts, batch, graphs=False)
    out = greedy("triton", prompts, batch, graphs=True)
    assert same_greedy(ref, out) <= 1
    for r, o in zip(ref, out):
        if r.token_ids == o.token_ids:
            torch.testing.assert_close(torch.stack(o.logits), torch.stack(r.logits), rtol=0, atol=1e-3)


def test_bf16_logits_of_the_triton_kernels_are_near_the_torch_ones():
    params = SamplingParams(max_tokens=1, return_logits=True)
    runs = [LLMEngine("small", EngineConfig(device="cuda", dtype="bfloat16", kernels=k)).generate(PROMPTS[:8], params)
            for k in ("torch", "triton")]
    for r, o in zip(*runs):
        ref, got = r.logits[0].float(), o.logits[0].float()
        assert (ref - got).abs().max().item() < 0.05 * ref.abs().max().item()


def sdpa_ops(eng: LLMEngine, prompts: list[list[int]]) -> set[str]:
    """The SDPA ops the prompts' prefill runs (max_tokens 1: no decode step, whose torch path
    masks its padding and so never runs at the flash backend)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        eng.generate(prompts, SamplingParams(max_tokens=1, ignore_eos=True))
    return {e.key for e in prof.key_averages() if "scaled_dot_product" in e.key}


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_fresh_prompts_of_any_length_run_at_the_flash_backend(kernels):
    eng = LLMEngine("small", EngineConfig(device="cuda", dtype="bfloat16", kernels=kernels, prefix_caching=False))
    eng.generate([PROMPTS[3]], SamplingParams(max_tokens=2, ignore_eos=True))
    ops = sdpa_ops(eng, [PROMPTS[i] for i in (5, 9, 22, 40)])  # four new lengths
    assert any("flash" in k for k in ops), ops
    assert not any(x in k for k in ops for x in ("efficient", "math", "cudnn")), ops


def test_prefill_after_cached_context_leaves_sdpa_for_the_packed_kernel():
    eng = LLMEngine("small", EngineConfig(device="cuda", dtype="bfloat16", kernels="triton", block_size=16))
    base = PROMPTS[40]  # 96+ tokens: whole blocks cached
    eng.generate([base], SamplingParams(max_tokens=2, ignore_eos=True))
    ops = sdpa_ops(eng, [base + [11, 12, 13], base[:80] + [14] * 30])
    assert not any(x in k for k in ops for x in ("efficient", "math", "cudnn")), ops
