"""The engine loop: batching, chunked prefill, preemption, the prompt/token KV handoff, limits."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.policy.machine import BatchingConfig
from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.kv_cache import KVExport
from splitserve.engine.sampler import SamplingParams
from splitserve.errors import UserError

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(3, 259, (n - 1,), generator=g).tolist() for n in lengths]


MIXED = prompts([1, 5, 17, 33, 64, 3, 120])


@pytest.fixture(scope="module")
def sequential():
    """Each prompt alone on a fresh engine: the reference."""
    return [LLMEngine("tiny").generate([p], GREEDY)[0].token_ids for p in MIXED]


def test_batched_equals_sequential(sequential):
    outs = LLMEngine("tiny").generate(MIXED, GREEDY)
    assert [o.token_ids for o in outs] == sequential


def test_staggered_arrivals_equal_sequential(sequential):
    """Requests joining while others decode (continuous batching) change nobody's tokens."""
    eng = LLMEngine("tiny")
    ids, final = {}, {}
    for i, p in enumerate(MIXED):
        ids[eng.add_request(p, GREEDY)] = i
        for out in eng.step():
            if out.finished:
                final[ids[out.request_id]] = out.token_ids
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                final[ids[out.request_id]] = out.token_ids
    assert [final[i] for i in range(len(MIXED))] == sequential


@pytest.mark.parametrize("chunk", [1, 7, 16, 50])
def test_chunked_prefill_equals_whole(sequential, chunk):
    eng = LLMEngine("tiny", EngineConfig(batching=BatchingConfig(chunk_size=chunk or 0, prompt_token_cap=64)))
    assert [o.token_ids for o in eng.generate(MIXED, GREEDY)] == sequential


def test_small_token_budget_and_seq_limit_equal_sequential(sequential):
    eng = LLMEngine("tiny", EngineConfig(max_num_seqs=2, batching=BatchingConfig(prompt_token_cap=16)))
    assert [o.token_ids for o in eng.generate(MIXED, GREEDY)] == sequential


def test_preemption_under_kv_pressure_equals_ample_kv(sequential):
    eng = LLMEngine("tiny", EngineConfig(num_blocks=12, block_size=16))  # 192 slots for ~440 tokens of work
    outs = eng.generate(MIXED, GREEDY)
    assert [o.token_ids for o in outs] == sequential
    assert eng.scheduler.num_preemptions > 0
    assert eng.blocks.num_free == 12


def test_logits_of_batched_and_chunked_runs_match_closely():
    params = SamplingParams(max_tokens=4, ignore_eos=True, return_logits=True)
    alone = LLMEngine("tiny").generate([MIXED[4]], params)[0]
    mixed = LLMEngine("tiny", EngineConfig(batching=BatchingConfig(chunk_size=5))).generate(MIXED, params)[4]
    torch.testing.assert_close(torch.stack(mixed.logits), torch.stack(alone.logits), rtol=0, atol=1e-5)


@settings(max_examples=12, deadline=None)
@given(lens=st.lists(st.integers(1, 40), min_size=1, max_size=6),
       max_tokens=st.lists(st.integers(1, 20), min_size=6, max_size=6),
       num_blocks=st.integers(4, 16), block_size=st.sampled_from([4, 8]),
       chunk=st.sampled_from([None, 3, 8]))
def test_random_workload_returns_every_block_and_never_shares(lens, max_tokens, num_blocks, block_size, chunk):
    eng = LLMEngine("tiny", EngineConfig(num_blocks=num_blocks, block_size=block_size,
                                         batching=BatchingConfig(chunk_size=chunk or 0, prompt_token_cap=32)))
    cap = num_blocks * block_size
    todo = {}
    for p, m in zip(prompts([min(n, cap - 1) for n in lens], seed=len(lens)), max_tokens):
        todo[eng.add_request(p, SamplingParams(max_tokens=m, ignore_eos=True))] = m
    done = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
        owners = {}
        for seq in eng.scheduler.running:  # no request reads (or writes) another's blocks
            for b in eng.blocks.block_table(seq.request_id):
                assert owners.setdefault(b, seq.request_id) == seq.request_id
        eng.blocks.check()
    assert eng.blocks.num_free == num_blocks
    assert set(done) == set(todo)
    for rid, out in done.items():  # done by max_tokens, or by the capacity of the cache
        assert out.finish_reason == "length"
        assert len(out.token_ids) == todo[rid] or len(out.prompt_token_ids) + len(out.token_ids) == cap


# ---- prompt/token split ---------------------------------------------------------------------

@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=15, ignore_eos=True),
    SamplingParams(max_tokens=15, ignore_eos=True, temperature=0.9, top_p=0.9, top_k=40, seed=7),
], ids=["greedy", "seeded-sampling"])
def test_prefill_on_a_then_decode_on_b_equals_a_alone(params):
    prompt = MIXED[5 - 1]
    alone = LLMEngine("tiny").generate([prompt], params)[0].token_ids
    a, b = LLMEngine("tiny", EngineConfig(seed=123)), LLMEngine("tiny", EngineConfig(seed=456))
    first = a.prefill_only(prompt, params)
    assert first.finish_reason == "prefill" and not first.finished
    assert first.kv.num_tokens == len(prompt)
    assert a.blocks.num_free == a.blocks.num_blocks  # A keeps nothing
    wire = KVExport.from_bytes(first.kv.metadata(), first.kv.to_bytes())  # what the transport does
    rid = b.kv_host.add_request_with_kv(prompt, first.token, wire, params)
    tokens = None
    while b.has_unfinished():
        for out in b.step():
            assert out.request_id == rid
            tokens = out.token_ids
    assert tokens == alone


def test_split_continues_alongside_other_requests(sequential):
    a, b = LLMEngine("tiny"), LLMEngine("tiny")
    b_ids = {b.add_request(p, GREEDY): i for i, p in enumerate(MIXED[:3])}
    final = {}

    def step_b():
        for out in b.step():
            if out.finished:
                final[b_ids[out.request_id]] = out.token_ids

    step_b()
    for i in range(3, len(MIXED)):
        first = a.prefill_only(MIXED[i], GREEDY)
        b_ids[b.kv_host.add_request_with_kv(MIXED[i], first.token, first.kv, GREEDY)] = i
        step_b()
    while b.has_unfinished():
        step_b()
    assert [final[i] for i in range(len(MIXED))] == sequential
    assert b.blocks.num_free == b.blocks.num_blocks


def test_export_import_round_trip_is_exact():
    eng = LLMEngine("tiny", EngineConfig(block_size=4))
    other = LLMEngine("tiny", EngineConfig(block_size=8))
    eng.add_request(MIXED[3], SamplingParams(max_tokens=1))
    eng.step()  # the request finishes; re-add one that keeps its blocks
    rid = eng.add_request(MIXED[4], SamplingParams(max_tokens=50, ignore_eos=True))
    eng.step()
    kv = eng.kv_host.export_kv(rid)
    assert kv.data.shape == (2, 2, 64, 2, 16) and kv.data.is_contiguous()
    assert kv.layer(1).is_contiguous()
    meta, raw = kv.metadata(), kv.to_bytes()
    assert len(raw) == kv.data.numel() * 4
    back = KVExport.from_bytes(meta, raw)
    assert torch.equal(back.data, kv.data)
    new_table = other.kv.import_request(back, other.blocks, "x")
    again = other.kv.export_request(new_table, 64)
    assert torch.equal(again.data, kv.data)
    assert not torch.equal(kv.data[:, :, :32], kv.data[:, :, 32:])  # not trivially constant


def test_import_of_wrong_shape_or_length_is_refused():
    a = LLMEngine("tiny")
    first = a.prefill_only(MIXED[2], GREEDY)
    with pytest.raises(UserError, match="covers"):
        a.kv_host.add_request_with_kv(MIXED[2][:-1], first.token, first.kv, GREEDY)
    bad = KVExport(first.kv.data[:1].contiguous())
    with pytest.raises(UserError, match="does not match"):
        a.kv_host.add_request_with_kv(MIXED[2], first.token, bad, GREEDY)
    assert a.blocks.num_free == a.blocks.num_blocks and not a.has_unfinished()


# ---- limits and stopping ----------------------------------------------------------------------

def test_prompt_longer_than_context_is_a_clear_error():
    eng = LLMEngine("tiny", EngineConfig(max_model_len=64))
    with pytest.raises(UserError, match="prompt has 64 tokens but the model context is 64"):
        eng.add_request(list(range(3, 67)))


def test_prompt_longer_than_kv_capacity_is_a_clear_error():
    eng = LLMEngine("tiny", EngineConfig(num_blocks=2, block_size=16))
    with pytest.raises(UserError, match="KV cache holds only 32 tokens"):
        eng.add_request(list(range(3, 43)))


def test_bad_token_ids_are_refused():
    with pytest.raises(UserError, match="outside the vocabulary"):
        LLMEngine("tiny").add_request([1, 259])


def test_generation_stops_at_context_end():
    eng = LLMEngine("tiny", EngineConfig(max_model_len=20))
    out = eng.generate([MIXED[2]], SamplingParams(max_tokens=100, ignore_eos=True))[0]
    assert len(out.token_ids) == 3 and out.finish_reason == "length"


def test_eos_stops_unless_ignored():
    eng = LLMEngine("tiny")
    ref = eng.generate([MIXED[1]], GREEDY)[0].token_ids
    stop_tok = ref[4]
    out = eng.generate([MIXED[1]], SamplingParams(max_tokens=12, stop_token_ids=(stop_tok,)))[0]
    assert out.token_ids == ref[: ref.index(stop_tok) + 1] and out.finish_reason == "stop"
    eng.eos_ids = {stop_tok}
    assert eng.generate([MIXED[1]], GREEDY)[0].token_ids == ref
    out = eng.generate([MIXED[1]], SamplingParams(max_tokens=12))[0]
    assert out.token_ids[-1] == stop_tok and out.finish_reason == "stop"


def test_stop_string_cuts_the_text():
    eng = LLMEngine("tiny")
    full = eng.generate(["Hello"], GREEDY)[0]
    stop = full.text[3:5]
    out = eng.generate(["Hello"], SamplingParams(max_tokens=12, ignore_eos=True, stop=(stop,)))[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.find(stop)]
    assert out.token_ids == full.token_ids[: len(out.token_ids)]


def test_text_prompts_use_the_tokenizer():
    eng = LLMEngine("tiny")
    assert eng.encode("hi") == [1, 3 + ord("h"), 3 + ord("i")]
    out = eng.generate(["hi"], GREEDY)[0]
    assert out.prompt_token_ids == [1, 107, 108] and len(out.token_ids) == 12


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 16])
def test_logits_of_few_rows_equal_the_plain_product(rows):
    """compute_logits multiplies w @ h.T for up to FEW_ROWS rows on CPU (a faster kernel there);
    the logits are those of h @ w.T, to float32 rounding."""
    eng = LLMEngine("tiny", EngineConfig(device="cpu", tokenizer=None))
    h = torch.randn(rows, eng.cfg.hidden_size, generator=torch.Generator().manual_seed(rows))
    got = eng.model.compute_logits(h)
    assert got.shape == (rows, eng.cfg.vocab_size) and got.is_contiguous()
    torch.testing.assert_close(got, torch.nn.functional.linear(h, eng.model.lm_weight()), rtol=1e-5, atol=1e-5)
