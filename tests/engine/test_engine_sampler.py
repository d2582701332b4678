"""Greedy / temperature / top-k / top-p sampling, per-request seeds, logit bias and penalties."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.sampler import Sampler, SamplingParams, filter_logits
from splitserve.errors import UserError

F32 = torch.finfo(torch.float32)


@dataclass
class Row:
    """What the sampler reads of a request (engine.Sequence in the engine)."""

    params: SamplingParams
    prompt_ids: list[int] = field(default_factory=lambda: [1])
    output_ids: list[int] = field(default_factory=list)


def at(params: SamplingParams, index: int) -> Row:
    """A request sampling its token number `index` (no penalties: the ids themselves do not matter)."""
    return Row(params, output_ids=[0] * index)


def test_greedy_is_argmax():
    logits = torch.randn(5, 30, generator=torch.Generator().manual_seed(0))
    assert Sampler("cpu")(logits, [Row(SamplingParams())] * 5) == logits.argmax(-1).tolist()


def test_seeded_rows_do_not_depend_on_the_batch_or_the_engine_seed():
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(1))
    p = SamplingParams(temperature=1.0, seed=42)
    alone = [Sampler("cpu", seed=s)(logits[2:3], [at(p, i)])[0] for i, s in zip(range(6), range(6))]
    others = [Row(SamplingParams(temperature=0.5))] * 2
    batch = [Sampler("cpu", seed=9)(logits, others + [at(p, i), Row(SamplingParams())])[2] for i in range(6)]
    assert alone == batch
    assert len(set(alone)) > 1  # the token index changes the draw


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0]]))
    s = Sampler("cpu", seed=3)
    draws = [s(logits, [Row(SamplingParams(temperature=1.0))])[0] for _ in range(3000)]
    freq = torch.bincount(torch.tensor(draws), minlength=4).float() / len(draws)
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.2, 0.0]), atol=0.04, rtol=0)


def test_top_k_and_top_p_filter():
    logits = torch.log(torch.tensor([[0.05, 0.4, 0.3, 0.25]]))
    k2 = filter_logits(logits, torch.tensor([2]), torch.tensor([1.0]))
    assert torch.isfinite(k2).tolist() == [[False, True, True, False]]
    p6 = filter_logits(logits, torch.tensor([0]), torch.tensor([0.6]))  # 0.4 + 0.3 covers 0.6
    assert torch.isfinite(p6).tolist() == [[False, True, True, False]]
    p1 = filter_logits(logits, torch.tensor([0]), torch.tensor([0.01]))  # the best always stays
    assert torch.isfinite(p1).tolist() == [[False, True, False, False]]
    s = Sampler("cpu")
    draws = {s(logits, [at(SamplingParams(temperature=2.0, top_k=2), i)])[0] for i in range(200)}
    assert draws == {1, 2}


def test_engine_sampling_is_reproducible_with_a_seed():
    p = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.95, seed=5, ignore_eos=True)
    runs = [LLMEngine("tiny", EngineConfig(seed=s)).generate([[1, 50, 60]], p)[0].token_ids for s in (0, 1)]
    assert runs[0] == runs[1]
    other = LLMEngine("tiny").generate([[1, 50, 60]], SamplingParams(
        max_tokens=20, temperature=1.0, top_p=0.95, seed=6, ignore_eos=True))[0].token_ids
    assert other != runs[0]


def test_unseeded_sampling_follows_the_engine_seed():
    p = SamplingParams(max_tokens=20, temperature=1.0, ignore_eos=True)
    a, b, c = (LLMEngine("tiny", EngineConfig(seed=s)).generate([[1, 50, 60]], p)[0].token_ids for s in (3, 3, 4))
    assert a == b and a != c


@pytest.mark.parametrize("bad", [
    dict(max_tokens=0), dict(temperature=-1), dict(temperature=float("nan")), dict(temperature=float("inf")),
    dict(top_p=0), dict(top_k=-2), dict(presence_penalty=2.5), dict(frequency_penalty=-2.01),
    dict(presence_penalty=float("nan")), dict(repetition_penalty=0), dict(repetition_penalty=-1),
    dict(repetition_penalty=float("inf")), dict(repetition_penalty=float("nan")),
    dict(logit_bias={1: 100.5}), dict(logit_bias={1: float("nan")}), dict(logit_bias={-1: 1.0}),
    dict(logit_bias={"7": 1.0}), dict(logit_bias={1.5: 1.0}), dict(logit_bias=((1, 2, 3),)),
])
def test_bad_sampling_params_are_user_errors(bad):
    with pytest.raises(UserError):
        SamplingParams(**bad)


def test_logit_bias_is_a_sorted_hashable_tuple():
    p = SamplingParams(logit_bias={9: 1, 3: -2.5})
    assert p.logit_bias == ((3, -2.5), (9, 1.0))
    same = SamplingParams(logit_bias=[(9, 1.0), (3, -2.5)])
    assert p == same and hash(p) == hash(same)


def test_logit_bias_outside_the_vocabulary_is_refused():
    eng = LLMEngine("tiny")
    with pytest.raises(UserError, match="logit_bias token id 259 is outside the vocabulary"):
        eng.add_request([1, 50], SamplingParams(logit_bias={259: 1.0}))
    assert not eng.has_unfinished()


# ---- robustness: any valid parameters, any finite logits ---------------------------------------

PROMPT = [1, 50, 60]


@pytest.mark.parametrize("top_k", [2**63, 2**64, 10**30, 259, -1])
def test_top_k_of_any_size_or_minus_one_is_off(top_k):
    """top_k 2**63 overflowed in torch.tensor and killed the worker; -1 (vLLM's "off") was refused."""
    sampled = dict(max_tokens=12, temperature=1.0, seed=3, ignore_eos=True)
    off = LLMEngine("tiny").generate([PROMPT], SamplingParams(**sampled))[0].token_ids
    assert LLMEngine("tiny").generate([PROMPT], SamplingParams(top_k=top_k, **sampled))[0].token_ids == off
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(0))
    rows = [Row(SamplingParams(temperature=1.0, top_k=top_k, seed=1)), Row(SamplingParams(top_k=top_k))]
    assert Sampler("cpu")(logits, rows)[1] == logits[1].argmax().item()


@pytest.mark.parametrize("temperature", [1e-300, 1e-6, 9.9e-6])
def test_a_tiny_temperature_is_greedy(temperature):
    """temperature 1e-300 made logits / temperature overflow: softmax gave NaN and token 0 (pad)."""
    greedy = LLMEngine("tiny").generate([PROMPT], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    params = SamplingParams(max_tokens=12, ignore_eos=True, temperature=temperature)
    assert LLMEngine("tiny").generate([PROMPT], params)[0].token_ids == greedy
    assert params.greedy and not SamplingParams(temperature=1e-5).greedy


def test_a_small_temperature_with_huge_logits_samples_the_best_token():
    logits = torch.tensor([[3e38, -3e38, 2.9e38, 0.0], [1e4, 1e4 - 1, -1e4, 1e4 - 0.5]])
    rows = [Row(SamplingParams(temperature=1e-5, seed=s)) for s in (1, 2)]
    assert Sampler("cpu")(logits, rows) == [0, 0]


def reference_logits(logits: torch.Tensor, row: Row) -> torch.Tensor:
    """A row's logits after bias and penalties, token by token (float32, in the sampler's order)."""
    p, z = row.params, logits.clone()
    for tok, b in p.logit_bias:
        z[tok] += torch.tensor(b)
    if p.penalized:
        rp = torch.tensor(p.repetition_penalty).clamp(F32.tiny, F32.max)
        for tok in set(row.prompt_ids) | set(row.output_ids):
            z[tok] = z[tok] / rp if z[tok] > 0 else z[tok] * rp
        for tok, count in Counter(row.output_ids).items():
            z[tok] = z[tok] - torch.tensor(p.frequency_penalty) * count - torch.tensor(p.presence_penalty)
        z = z.clamp(-F32.max, F32.max)
    return z


def sampling_params(vocab: int) -> st.SearchStrategy[SamplingParams]:
    """Any valid parameters, with the extremes that broke the sampler."""
    return st.builds(
        SamplingParams,
        temperature=st.one_of(st.sampled_from([0.0, 1e-300, 1e-6, 1e-5, 2.0]), st.floats(0, 2)),
        top_k=st.one_of(st.integers(-1, vocab + 1), st.integers(-1, 2**64)),
        top_p=st.floats(0, 1, exclude_min=True),
        seed=st.one_of(st.none(), st.integers(0, 2**64)),
        presence_penalty=st.one_of(st.just(0.0), st.floats(-2, 2)),
        frequency_penalty=st.one_of(st.just(0.0), st.floats(-2, 2)),
        repetition_penalty=st.one_of(st.just(1.0), st.floats(0.01, 100), st.sampled_from([1e-300, 1e300])),
        logit_bias=st.dictionaries(st.integers(0, vocab - 1), st.floats(-100, 100), max_size=4))


@st.composite
def batches(draw):
    """Finite logits (large magnitudes, tiny spreads, ties) and a request per row."""
    vocab, n = draw(st.integers(2, 40)), draw(st.integers(1, 4))
    scale = draw(st.sampled_from([0.0, 1e-6, 1.0, 1e4, 1e37]))
    offset = draw(st.sampled_from([0.0, 1e4, -1e4]))
    u = draw(st.lists(st.floats(-1, 1, width=32), min_size=n * vocab, max_size=n * vocab))
    logits = torch.tensor(u).view(n, vocab) * scale + offset
    tokens = st.lists(st.integers(0, vocab - 1), max_size=8)
    rows = [Row(draw(sampling_params(vocab)), [1] + draw(tokens), draw(tokens)) for _ in range(n)]
    return logits, rows


@settings(max_examples=300, deadline=None)
@given(batch=batches(), engine_seed=st.integers(0, 2**32))
def test_any_valid_request_gets_a_token_it_could_draw(batch, engine_seed):
    """One in-vocabulary token per row; greedy rows take the argmax of the biased, penalized
    logits; sampled rows a token inside their top-k and top-p nucleus whose probability at their
    temperature is not 0 (top_k 1: the argmax)."""
    logits, rows = batch
    before = logits.clone()
    tokens = Sampler("cpu", seed=engine_seed)(logits, rows)
    assert torch.equal(logits, before)  # the caller's logits (kept for return_logits) are not touched
    assert len(tokens) == len(rows)
    for tok, row, x in zip(tokens, rows, logits):
        p, z = row.params, reference_logits(x, row)
        vocab = z.numel()
        assert 0 <= tok < vocab
        if p.greedy:
            assert tok == z.argmax().item()
            continue
        s = ((z - z.max()) / p.temperature).double()  # float32, as the sampler scales (ties as it sees them)
        assert s[tok] > -110  # exp() of a float32 logit this far below the best is not 0
        k = p.top_k if 0 < p.top_k < vocab else vocab
        better = s > s[tok]
        assert better.sum() < k
        nucleus = s >= s.topk(k).values[-1]
        probs = torch.where(nucleus, s, float("-inf")).softmax(-1)
        assert probs[better].sum() <= p.top_p + 1e-4  # the mass of the better tokens leaves room for it


# ---- logit bias and penalties change what the model says ---------------------------------------

HELLO = "Hello"  # the tiny model repeats itself: 126, 126, 126, 126, 4, 4, 4, 4, 4, ...


def test_logit_bias_forces_and_forbids_tokens():
    eng = LLMEngine("tiny")
    base = SamplingParams(max_tokens=10, ignore_eos=True)
    plain = eng.generate([HELLO], base)[0].token_ids
    forced = eng.generate([HELLO], SamplingParams(max_tokens=10, ignore_eos=True, logit_bias={77: 100}))[0]
    assert forced.token_ids == [77] * 10
    banned = SamplingParams(max_tokens=10, ignore_eos=True, logit_bias={t: -100 for t in set(plain)})
    assert not set(eng.generate([HELLO], banned)[0].token_ids) & set(plain)
    seeded = SamplingParams(max_tokens=10, ignore_eos=True, temperature=1.0, seed=1, logit_bias={77: 100})
    assert eng.generate([HELLO], seeded)[0].token_ids == [77] * 10  # sampled requests too


@pytest.mark.parametrize("penalty", ["frequency_penalty", "presence_penalty"])
def test_frequency_and_presence_penalties_break_a_repetition_loop(penalty):
    eng = LLMEngine("tiny")
    plain = eng.generate([HELLO], SamplingParams(max_tokens=20, ignore_eos=True))[0].token_ids
    assert max(Counter(plain).values()) >= 4
    out = eng.generate([HELLO], SamplingParams(max_tokens=20, ignore_eos=True, **{penalty: 2.0}))[0].token_ids
    assert out[0] == plain[0] and len(set(out)) == 20  # no token twice


def test_a_negative_frequency_penalty_tightens_the_loop():
    eng = LLMEngine("tiny")
    out = eng.generate([HELLO], SamplingParams(max_tokens=20, ignore_eos=True, frequency_penalty=-0.5))[0]
    assert out.token_ids == [126] * 20


def test_repetition_penalty_covers_the_prompt():
    """The first token is repeated from the prompt: the repetition penalty (prompt and output)
    changes it, the presence and frequency penalties (output only) do not."""
    eng = LLMEngine("tiny")
    prompt = [1, 204, 47, 16, 124]
    first = eng.generate([prompt], SamplingParams(max_tokens=1))[0].token_ids
    assert first == [47]
    assert eng.generate([prompt], SamplingParams(max_tokens=1, repetition_penalty=1.3))[0].token_ids != first
    assert eng.generate([prompt], SamplingParams(max_tokens=1, repetition_penalty=0.5))[0].token_ids == first
    both = SamplingParams(max_tokens=1, presence_penalty=2.0, frequency_penalty=2.0)
    assert eng.generate([prompt], both)[0].token_ids == first


# ---- the same tokens across the prompt/token split ----------------------------------------------

PENALIZED = dict(max_tokens=16, ignore_eos=True, repetition_penalty=1.3, frequency_penalty=0.5,
                 logit_bias={126: 5.0, 4: -3.0})


@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.8, top_k=50, top_p=0.9, seed=11)],
                         ids=["greedy", "seeded-sampling"])
@pytest.mark.parametrize("handoff", ["import", "layerwise"])
def test_penalties_and_bias_are_the_same_across_the_split(sampling, handoff):
    params = SamplingParams(**PENALIZED, **sampling)
    alone = LLMEngine("tiny").generate([HELLO], params)[0].token_ids
    plain = LLMEngine("tiny").generate([HELLO], SamplingParams(max_tokens=16, ignore_eos=True))[0].token_ids
    assert alone != plain  # the parameters matter here
    a, b = LLMEngine("tiny", EngineConfig(seed=1)), LLMEngine("tiny", EngineConfig(seed=2))
    b.add_request([1, 60, 70], SamplingParams(max_tokens=30, ignore_eos=True))  # B is busy with another request
    b.step()
    a.add_request([1, 80, 90, 100], SamplingParams(max_tokens=3, presence_penalty=1.0))  # and so is A
    prompt = a.encode(HELLO)
    first = a.prefill_only(prompt, params)
    if handoff == "import":
        rid = b.kv_host.add_request_with_kv(prompt, first.token, first.kv, params)
    else:
        rid = "r"
        b.kv_host.reserve_kv(prompt, params, rid)
        for layer in range(first.kv.num_layers):
            b.kv_host.write_kv_layer(rid, layer, first.kv.layer(layer))
        b.kv_host.start_reserved(rid, first.token)
    tokens = None
    while b.has_unfinished():
        for out in b.step():
            if out.request_id == rid:
                tokens = out.token_ids
    assert tokens == alone


def test_min_p_keeps_the_tokens_within_its_share_of_the_best():
    # probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1: min_p 0.5 keeps p >= 0.25 (tokens 0, 1),
    # min_p 0.2 keeps p >= 0.1 (0, 1, 2), 0 keeps all four
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = {}
    for min_p in (0.5, 0.2, 0.0):
        rows = [Row(SamplingParams(temperature=1.0, seed=s, min_p=min_p)) for s in range(400)]
        kept[min_p] = set(Sampler("cpu")(logits.expand(400, 4), rows))
    assert kept == {0.5: {0, 1}, 0.2: {0, 1, 2}, 0.0: {0, 1, 2, 3}}


def test_min_tokens_masks_eos_and_stop_tokens_until_then():
    logits = torch.tensor([[0.0, 1.0, 9.0, 5.0, 8.0, 2.0]])      # EOS (2) best, then stop token 4, then 3
    sampler = Sampler("cpu", eos_ids=[2])
    p = SamplingParams(min_tokens=3, stop_token_ids=(4,))
    assert [sampler(logits, [at(p, i)])[0] for i in range(5)] == [3, 3, 3, 2, 2]
    ignoring = SamplingParams(min_tokens=3, ignore_eos=True)      # EOS stops nothing there: not masked
    assert sampler(logits, [at(ignoring, 0)]) == [2]


@pytest.mark.parametrize("kw", [dict(min_p=1.5), dict(min_p=-0.1), dict(min_tokens=17), dict(min_tokens=-1)])
def test_min_p_and_min_tokens_out_of_range_are_refused(kw):
    with pytest.raises(UserError):
        SamplingParams(max_tokens=16, **kw)
