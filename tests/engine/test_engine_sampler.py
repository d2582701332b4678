"""Greedy / temperature / top-k / top-p sampling and per-request seeds."""

from __future__ import annotations

import pytest
import torch

from splitserve.engine.engine import LLMEngine
from splitserve.engine.sampler import Sampler, SamplingParams, filter_logits
from splitserve.errors import UserError


def test_greedy_is_argmax():
    logits = torch.randn(5, 30, generator=torch.Generator().manual_seed(0))
    assert Sampler("cpu")(logits, [SamplingParams()] * 5, [0] * 5) == logits.argmax(-1).tolist()


def test_seeded_rows_do_not_depend_on_the_batch_or_the_engine_seed():
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(1))
    p = SamplingParams(temperature=1.0, seed=42)
    alone = [Sampler("cpu", seed=s)(logits[2:3], [p], [i])[0] for i, s in zip(range(6), range(6))]
    batch = [Sampler("cpu", seed=9)(logits, [SamplingParams(temperature=0.5)] * 2 + [p] + [SamplingParams()],
                                    [0, 0, i, 0])[2] for i in range(6)]
    assert alone == batch
    assert len(set(alone)) > 1  # the token index changes the draw


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0]]))
    s = Sampler("cpu", seed=3)
    draws = [s(logits, [SamplingParams(temperature=1.0)], [0])[0] for _ in range(3000)]
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
    draws = {s(logits, [SamplingParams(temperature=2.0, top_k=2)], [i])[0] for i in range(200)}
    assert draws == {1, 2}


def test_engine_sampling_is_reproducible_with_a_seed():
    p = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.95, seed=5, ignore_eos=True)
    runs = [LLMEngine("tiny", seed=s).generate([[1, 50, 60]], p)[0].token_ids for s in (0, 1)]
    assert runs[0] == runs[1]
    other = LLMEngine("tiny").generate([[1, 50, 60]], SamplingParams(
        max_tokens=20, temperature=1.0, top_p=0.95, seed=6, ignore_eos=True))[0].token_ids
    assert other != runs[0]


def test_unseeded_sampling_follows_the_engine_seed():
    p = SamplingParams(max_tokens=20, temperature=1.0, ignore_eos=True)
    a, b, c = (LLMEngine("tiny", seed=s).generate([[1, 50, 60]], p)[0].token_ids for s in (3, 3, 4))
    assert a == b and a != c


@pytest.mark.parametrize("bad", [dict(max_tokens=0), dict(temperature=-1), dict(top_p=0), dict(top_k=-2)])
def test_bad_sampling_params_are_user_errors(bad):
    with pytest.raises(UserError):
        SamplingParams(**bad)
