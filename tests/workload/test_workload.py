"""Workloads: trace loading, synthetic sizes fitted to the traces, rates, laziness."""

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.errors import UserError
from splitserve.workload import RequestSpec, make_workload
from splitserve.workload.trace import load_trace

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason=f"Azure traces not found at {TRACES}")


def write(tmp_path, text):
    p = tmp_path / "t.csv"
    p.write_text(text)
    return p


def test_trace_loads_exactly(tmp_path):
    p = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                        "2023-11-16 18:17:03.9799600,4808,10\n"
                        "2023-11-16 18:17:04.0319600,3180,8\n"
                        "2023-11-16 18:17:05.5000000,12,1\n")
    tr = load_trace(p)
    assert tr.arrival_s.tolist() == pytest.approx([0.0, 0.052, 1.52004])
    assert tr.prompt_tokens.tolist() == [4808, 3180, 12]
    assert tr.output_tokens.tolist() == [10, 8, 1]
    w = make_workload(str(p))
    assert list(w) == [RequestSpec(*x) for x in zip(tr.arrival_s, [4808, 3180, 12], [10, 8, 1])]


@pytest.mark.parametrize("row, where", [("2023-11-16 18:17:03.97,12,x", "line 3"),
                                         ("yesterday,12,3", "line 3"),
                                         ("2023-11-16 18:17:03.97,-4,3", "line 3"),
                                         ("2023-11-16 18:17:03.97,12", "line 3")])
def test_malformed_rows_name_their_line(tmp_path, row, where):
    p = write(tmp_path, f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,5,5\n{row}\n")
    with pytest.raises(UserError, match=where):
        load_trace(p)


def test_trace_rescaled_to_target_rate_and_replayed(tmp_path):
    rows = "".join(f"{i * 0.5},{100 + i},{1 + i % 7}\n" for i in range(101))     # 2 req/s for 50 s
    p = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    w = make_workload(str(p), rps=10.0, duration=30.0)
    xs = list(w)
    gaps = np.diff([x.arrival for x in xs])
    assert gaps == pytest.approx(0.1)             # time-scaled 5x, replayed back to back
    assert len(xs) == 300 and xs[101].prompt_tokens == 100


def test_poisson_arrivals_have_the_rate_and_cv_of_an_exponential():
    xs = [x.arrival for x in make_workload("conversation", rps=40.0, max_requests=50_000, seed=3)]
    gaps = np.diff(xs)
    assert 1 / gaps.mean() == pytest.approx(40.0, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)


def test_paper_medians():
    """Splitwise §III-A: coding median prompt 1500 and output 13; conversation 1020 and 129."""
    for name, prompt, out in (("coding", 1500, 13), ("conversation", 1020, 129)):
        xs = list(make_workload(name, rps=100, max_requests=40_000, seed=1))
        assert np.median([x.prompt_tokens for x in xs]) == pytest.approx(prompt, rel=0.04)
        assert np.median([x.output_tokens for x in xs]) == pytest.approx(out, rel=0.04)


@needs_traces
@pytest.mark.parametrize("name, file", [("coding", "azure_2023_code.csv"), ("conversation", "azure_2023_conv.csv")])
def test_synthetic_matches_the_trace(name, file):
    tr = load_trace(TRACES / file)
    xs = list(make_workload(name, rps=100, max_requests=60_000, seed=2))
    for ours, real in (([x.prompt_tokens for x in xs], tr.prompt_tokens), ([x.output_tokens for x in xs], tr.output_tokens)):
        for q in (50, 90, 99):
            assert np.percentile(ours, q) == pytest.approx(np.percentile(real, q), rel=0.05)


def test_same_seed_same_requests_other_seed_differs():
    a = list(make_workload("coding", rps=5, duration=60, seed=4))
    assert a == list(make_workload("coding", rps=5, duration=60, seed=4))
    assert a != list(make_workload("coding", rps=5, duration=60, seed=5))


def test_iteration_is_lazy():
    tracemalloc.start()
    n = sum(1 for _ in make_workload("coding", rps=700, duration=700, seed=0))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert n > 450_000 and peak < 5e6


@settings(max_examples=40, deadline=None)
@given(st.floats(0.1, 500), st.floats(0.5, 120), st.integers(0, 10**6), st.sampled_from(["coding", "conversation"]))
def test_arrivals_in_window_sorted_and_sizes_positive(rps, duration, seed, name):
    xs = list(make_workload(name, rps=rps, duration=duration, seed=seed, max_context=4096))
    arr = [x.arrival for x in xs]
    assert all(0 <= a < duration for a in arr) and arr == sorted(arr)
    assert all(x.prompt_tokens >= 1 and x.output_tokens >= 1 and x.prompt_tokens + x.output_tokens <= 4096 for x in xs)


@pytest.mark.parametrize("kw, msg", [(dict(rps=0), "rps"), (dict(rps=-1), "rps"), (dict(duration=0), "duration")])
def test_bad_parameters(kw, msg):
    with pytest.raises(UserError, match=msg):
        make_workload("coding", **kw)


def test_unknown_workload_lists_the_valid_ones():
    with pytest.raises(UserError, match="coding, conversation"):
        make_workload("chat")
