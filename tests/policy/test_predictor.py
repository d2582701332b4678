"""Output-length predictors: the oracle is the truth, the noisy ones are as accurate as the papers
report, and every prediction depends on (seed, request id) only."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.errors import UserError
from splitserve.policy.predictor import (PRESETS, BucketPredictor, OraclePredictor, Prediction,
                                         RelativePredictor, make_predictor, uniform)

N = 20_000


def _sizes(n):
    """Output lengths 1..2000 spread over many buckets (deterministic)."""
    return [1 + int(uniform(99, i) * 2000) for i in range(n)]


def test_oracle_is_the_truth():
    p = OraclePredictor()
    assert [p.predict(i, 100, n) for i, n in enumerate([1, 7, 2048])] == [(1, 1), (7, 7), (2048, 2048)]


def test_bucket_edges_by_hand():
    exact = BucketPredictor(granularity=200, accuracy=1.0)
    assert exact.predict(0, 10, 1) == Prediction(1, 200)
    assert exact.predict(0, 10, 200) == Prediction(1, 200)
    assert exact.predict(0, 10, 201) == Prediction(201, 400)
    wrong = BucketPredictor(granularity=200, accuracy=0.0)
    assert wrong.predict(0, 10, 50) == Prediction(201, 400)          # bucket 0's only neighbour is above
    assert {wrong.predict(i, 10, 450) for i in range(200)} == {Prediction(201, 400), Prediction(601, 800)}


@pytest.mark.parametrize("name,acc", [("tetriinfer-100", 0.589), ("tetriinfer-200", 0.749), ("tetriinfer-400", 0.850)])
def test_bucket_accuracy_is_the_papers(name, acc):
    p = make_predictor(name, seed=3)
    hits = sum(p.predict(i, 100, n).lo <= n <= p.predict(i, 100, n).hi for i, n in enumerate(_sizes(N)))
    assert abs(hits / N - acc) < 4 * math.sqrt(acc * (1 - acc) / N)      # within 4 standard errors


@pytest.mark.parametrize("name,acc", [("ecoserve-alpaca", 0.775), ("ecoserve-sharegpt", 0.732),
                                      ("ecoserve-bookcorpus", 0.698)])
def test_padded_estimate_covers_the_truth_as_often_as_the_paper_says(name, acc):
    p = make_predictor(name, seed=5)
    covered = sum(p.predict(i, 100, n).hi >= n for i, n in enumerate(_sizes(N)))
    # rounding to whole tokens covers a few more short outputs than the continuous model
    assert abs(covered / N - acc) < 4 * math.sqrt(acc * (1 - acc) / N) + 0.01


@settings(max_examples=50)
@given(st.sampled_from(sorted(PRESETS)), st.integers(0, 2**32), st.lists(st.integers(1, 4000), min_size=2, max_size=30))
def test_a_prediction_depends_on_seed_and_request_only(name, seed, outputs):
    p = make_predictor(name, seed)
    forward = [p.predict(i, 50, n) for i, n in enumerate(outputs)]
    backward = [p.predict(i, 50, n) for i, n in reversed(list(enumerate(outputs)))][::-1]
    assert forward == backward
    assert all(1 <= lo <= hi for lo, hi in forward)


def test_seeds_differ_and_bad_names_are_refused():
    a, b = make_predictor("tetriinfer-200", 1), make_predictor("tetriinfer-200", 2)
    sizes = _sizes(500)
    assert [a.predict(i, 1, n) for i, n in enumerate(sizes)] != [b.predict(i, 1, n) for i, n in enumerate(sizes)]
    with pytest.raises(UserError, match="unknown length predictor"):
        make_predictor("psychic")
    with pytest.raises(UserError):
        RelativePredictor(accuracy=0.4)
