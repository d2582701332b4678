"""GPU code paths: CUDA graphs for decode, bf16 on CUDA, the split across devices.
Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.sampler import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="needs CUDA: GPU engine paths")]

PROMPTS = [[1] + [(13 * i + j) % 250 + 3 for j in range(n)] for i, n in enumerate([1, 4, 17, 40, 9, 70, 2, 33, 5])]
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True, return_logits=True)


def test_cuda_graph_decode_equals_eager():
    eager = LLMEngine("tiny", EngineConfig(device="cuda", dtype="float32")).generate(PROMPTS, GREEDY)
    graphed_engine = LLMEngine("tiny", EngineConfig(device="cuda", dtype="float32", cuda_graphs=True, max_num_seqs=16))
    graphed = graphed_engine.generate(PROMPTS, GREEDY)
    assert graphed_engine.graphs.graphs, "no decode step ran through a CUDA graph"
    for e, g in zip(eager, graphed):
        assert e.token_ids == g.token_ids
        torch.testing.assert_close(torch.stack(g.logits), torch.stack(e.logits), atol=1e-4, rtol=0)


def test_cuda_graphs_survive_preemption_and_odd_batch_sizes():
    # the reference is eager on CUDA: a preset's random weights are drawn on its device, and CUDA's
    # generator gives other numbers than the CPU's (first run on an H100: CPU-drawn tokens differed)
    eager = LLMEngine("tiny", EngineConfig(device="cuda", dtype="float32"))
    ref = [o.token_ids for o in eager.generate(PROMPTS, GREEDY)]
    eng = LLMEngine("tiny", EngineConfig(device="cuda", dtype="float32", cuda_graphs=True, num_blocks=14,
                                         block_size=8, max_num_seqs=5))
    assert [o.token_ids for o in eng.generate(PROMPTS, GREEDY)] == ref
    assert eng.blocks.num_free == 14


def test_cuda_fp32_matches_transformers(checkpoints):
    path, hf = checkpoints["llama"]
    prompt = PROMPTS[5]
    out = LLMEngine(path, EngineConfig(device="cuda", dtype="float32")).generate([prompt], GREEDY)[0]
    with torch.no_grad():
        ref = hf(torch.tensor([prompt + out.token_ids[:-1]])).logits[0, len(prompt) - 1:]
    assert (torch.stack(out.logits) - ref).abs().max().item() < 1e-3


def test_cuda_bf16_is_close_to_cpu_fp32(checkpoints):
    path, _ = checkpoints["qwen2"]
    params = SamplingParams(max_tokens=1, return_logits=True)
    cpu = LLMEngine(path).generate([PROMPTS[5]], params)[0].logits[0]
    gpu = LLMEngine(path, EngineConfig(device="cuda", dtype="bfloat16")).generate([PROMPTS[5]], params)[0].logits[0]
    assert (cpu - gpu).abs().max().item() < 0.25 * cpu.abs().max().item()


def test_split_from_gpu_prompt_worker_to_gpu_token_worker():
    a = LLMEngine("tiny", EngineConfig(device="cuda", dtype="bfloat16"))
    b = LLMEngine("tiny", EngineConfig(device="cuda", dtype="bfloat16", cuda_graphs=True))
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    graphed = LLMEngine("tiny", EngineConfig(device="cuda", dtype="bfloat16", cuda_graphs=True))
    alone = graphed.generate([PROMPTS[3]], params)[0]
    first = a.prefill_only(PROMPTS[3], params)
    assert first.kv.data.device.type == "cuda" and first.kv.data.dtype == torch.bfloat16
    b.kv_host.add_request_with_kv(PROMPTS[3], first.token, first.kv, params)
    tokens = None
    while b.has_unfinished():
        for out in b.step():
            tokens = out.token_ids
    assert tokens == alone.token_ids


def test_prompt_attention_stays_off_cudnn():
    # cuDNN's SDPA builds a graph per new shape: 6 ms a layer for every new prompt length on an
    # H200 (benchmarks/engine/README.md); the engine keeps SDPA to the other backends
    from torch.profiler import ProfilerActivity, profile

    eng = LLMEngine("tiny", EngineConfig(device="cuda", dtype="bfloat16"))
    eng.generate([PROMPTS[3]], SamplingParams(max_tokens=2, ignore_eos=True))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        eng.generate([PROMPTS[5], PROMPTS[7]], SamplingParams(max_tokens=2, ignore_eos=True))
    ops = {e.key for e in prof.key_averages()}
    assert any("attention" in k for k in ops), sorted(ops)
    assert not any("cudnn_attention" in k for k in ops), sorted(k for k in ops if "attention" in k)
