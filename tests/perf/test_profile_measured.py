"""The profile fit of a machine splitserve measured itself (`fit_profile(..., attention=True)`,
used by `splitserve profile` / `twin`): a prompt's attention term in its tokens squared, and the
decode step additive in the KV tokens read with a slope per batch size, all hand-computed."""

from __future__ import annotations

import pytest

from splitserve.perf.profile import ProfilePerfModel, fit_profile
from splitserve.twin.machine import MachineProfile


def _row(p, b, prompt_ms, token_ms, t=16):
    return {"prompt_size": p, "batch_size": b, "token_size": t, "prompt_time": prompt_ms, "token_time": token_ms}


# the sweep: 32-token prompts, 16 tokens, so its decodes read 40 tokens of KV each on average;
# decode times not monotone in the batch (3 requests slower than 4), as on this engine's CPU kernels
SWEEP = [_row(32, 1, 10.0, 10.0), _row(32, 2, 20.0, 16.0), _row(32, 3, 30.0, 20.0), _row(32, 4, 40.0, 18.0)]
# a lone 128-token prompt: the sweep's line gives 40 ms for 128 tokens, plus 1e-6 s x 128^2;
# its decodes read 136 tokens: 96 more than the sweep's, at 5 us per token
LONE = _row(128, 1, 40.0 + 1e-3 * 128 ** 2, 10.0 + 96 * 5e-3)
# two 128-token prompts: 2 x 96 more KV tokens than the sweep's batch of 2, at 10 us per token
PAIR = _row(128, 2, 0.0, 16.0 + 2 * 96 * 10e-3)


def test_fit_attention_and_decode_slopes_by_hand():
    fit = fit_profile(SWEEP + [LONE, PAIR], attention=True)
    assert fit["attention"] == pytest.approx(1e-6)
    assert [y * 1e3 for _, y in fit["batch_knots"]] == pytest.approx([10.0, 16.0, 20.0, 18.0])  # as measured
    assert [b for b, _ in fit["ctx_slopes"]] == [1.0, 2.0]
    assert [k for _, k in fit["ctx_slopes"]] == pytest.approx([5e-6, 10e-6])
    assert fit["ctx_ref"] == 40.0


def test_decode_time_is_the_batch_cost_plus_kv_read():
    m = ProfilePerfModel.from_rows(SWEEP + [LONE, PAIR], attention=True)
    assert m.token_time(4, 4 * 40) == pytest.approx(0.018)              # the sweep's own point
    assert m.token_time(1, 200) == pytest.approx(0.010 + 160 * 5e-6)
    assert m.token_time(3, 300) == pytest.approx(0.020 + 180 * 10e-6)   # slope flat past batch 2
    assert m.token_time(2, 2 * 136) == pytest.approx(PAIR["token_time"] / 1e3)
    # a prompt step: the sweep's line in batched tokens, plus the attention term
    assert m.mixed_time(128, 0, 0, 128 ** 2) == pytest.approx(LONE["prompt_time"] / 1e3)


def test_without_attention_the_splitwise_form_is_kept():
    fit = fit_profile(SWEEP + [LONE, PAIR])
    assert fit["ctx_slopes"] == [] and fit["attention"] == 0.0
    assert [y * 1e3 for _, y in fit["batch_knots"]] == pytest.approx([10.0, 16.0, 19.0, 19.0])  # pooled


def test_decode_kv_is_padded_to_the_longest_in_blocks():
    m = MachineProfile(name="m", facts={"block_size": 16}, perf=None, model=None, link=None, transport="tcp")
    assert m.timing.decode_kv(longest=17, decodes=3) == 3 * 32
    assert m.timing.decode_kv(longest=32, decodes=1) == 32
