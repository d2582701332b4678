"""Log-probabilities (engine/logprobs.py): generated tokens' and prompt tokens' logprobs against
transformers' log-softmax on the same checkpoint (within 1e-4, the top N the same tokens), the
same whether the prompt runs whole or in chunks, after preemption, or beside a cached prefix (a
scored prompt is computed whole); greedy tokens unchanged; out-of-range counts refused."""

from __future__ import annotations

import pytest
import torch
from engine_runs import run_to_end

from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.sampler import SamplingParams
from splitserve.errors import UserError
from splitserve.policy.machine import BatchingConfig

PROMPT = [1] + [(11 * i + 5) % 250 + 3 for i in range(30)]
TOL = 1e-4




def test_logprobs_equal_transformers_log_softmax(checkpoints):
    path, hf = checkpoints["llama"]
    eng = LLMEngine(path, EngineConfig(device="cpu", dtype="float32"))
    out = run_to_end(eng, [PROMPT], SamplingParams(max_tokens=8, ignore_eos=True, logprobs=5, prompt_logprobs=3))[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([PROMPT + out.token_ids[:-1]])).logits[0].float(), -1)
    assert len(out.prompt_logprobs) == len(PROMPT) - 1 and len(out.logprobs) == 8
    for q, (tok, lp, rank, top) in enumerate(out.prompt_logprobs):  # position q scores PROMPT[q + 1]
        assert tok == PROMPT[q + 1] and abs(lp - ref[q, tok].item()) < TOL
        assert rank == int((ref[q] > ref[q, tok]).sum()) + 1
        assert [t for t, _ in top] == ref[q].topk(3).indices.tolist()
        assert max(abs(v - ref[q, t].item()) for t, v in top) < TOL
    for j, (tok, lp, rank, top) in enumerate(out.logprobs):
        row = ref[len(PROMPT) - 1 + j]
        assert tok == out.token_ids[j] and abs(lp - row[tok].item()) < TOL
        assert rank == 1 and top[0][0] == tok  # greedy: the most likely
        assert [t for t, _ in top] == row.topk(5).indices.tolist()


def test_the_same_whole_chunked_preempted_or_beside_a_cached_prefix():
    g = torch.Generator().manual_seed(4)
    prompts = [[1] + torch.randint(3, 259, (n,), generator=g).tolist() for n in (40, 70, 25)]
    params = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=2, prompt_logprobs=2)
    whole = run_to_end(LLMEngine("tiny"), prompts, params)
    chunked = LLMEngine("tiny", EngineConfig(batching=BatchingConfig(chunk_size=16, prompt_token_cap=64)))
    tight = LLMEngine("tiny", EngineConfig(num_blocks=9, block_size=16))
    for eng in (chunked, tight):
        got = run_to_end(eng, prompts, params)
        for a, b in zip(whole, got):
            assert a.token_ids == b.token_ids
            for x, y in ((a.prompt_logprobs, b.prompt_logprobs), (a.logprobs, b.logprobs)):
                assert [r[0] for r in x] == [r[0] for r in y]
                assert max(abs(r[1] - s[1]) for r, s in zip(x, y)) < 1e-4
    assert tight.scheduler.num_preemptions > 0
    eng = LLMEngine("tiny")
    run_to_end(eng, [prompts[1]], SamplingParams(max_tokens=2))                # its blocks are cached now
    again = run_to_end(eng, [prompts[1]], params)[0]
    assert again.num_cached_tokens == 0 and len(again.prompt_logprobs) == len(prompts[1]) - 1
    assert max(abs(r[1] - s[1]) for r, s in zip(again.prompt_logprobs, whole[1].prompt_logprobs)) < 1e-4
    plain = run_to_end(LLMEngine("tiny"), prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    assert [o.token_ids for o in plain] == [o.token_ids for o in whole]
    assert plain[0].logprobs is None and plain[0].prompt_logprobs is None


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_counts_out_of_range_are_refused(field):
    SamplingParams(**{field: 20})
    for bad in (-1, 21):
        with pytest.raises(UserError, match=f"{field} must be in \\[0, 20\\]"):
            SamplingParams(**{field: bad})
