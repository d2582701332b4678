"""Time-varying arrival rates (workload/rate.py): a non-homogeneous Poisson process by thinning."""

import math

import numpy as np
import pytest

from splitserve.errors import UserError
from splitserve.workload import BLOCK, make_workload
from splitserve.workload.rate import parse_rate_profile


def arrivals(source="conversation", **kw):
    return np.array([r.arrival for r in make_workload(source, **kw)])


def test_parse_and_rate_by_hand():
    p = parse_rate_profile("0:5, 60:20, 120:5")
    assert p.rate([0.0, 59.999, 60.0, 119.9, 120.0, 1e6]).tolist() == [5, 5, 20, 20, 5, 5]
    assert p.peak == 20
    assert p.expected(0, 180) == pytest.approx(5 * 60 + 20 * 60 + 5 * 60)
    assert p.expected(50, 70) == pytest.approx(5 * 10 + 20 * 10)
    s = parse_rate_profile("sin:10:5:600")
    assert s.rate([0.0, 150.0, 450.0]).tolist() == pytest.approx([10, 15, 5])
    assert s.expected(0, 600) == pytest.approx(6000)
    assert s.expected(0, 300) == pytest.approx(3000 + 5 * 600 / math.pi)


@pytest.mark.parametrize("bad", ["5:1,10:2", "0:1,0:2", "0:1,10:0", "0:-1,5:2", "0:x", "0-5",
                                 "sin:10:11:60", "sin:10:5", "sin:0:0:60", "0:inf"])
def test_bad_profiles_are_user_errors(bad):
    with pytest.raises(UserError, match="rate profile"):
        parse_rate_profile(bad)


def test_rate_and_profile_together_rejected():
    with pytest.raises(UserError, match="not both"):
        make_workload("coding", rps=3.0, rate_profile="0:1")


def test_constant_profile_keeps_every_candidate():
    # hand-checkable: at a constant rate every candidate passes thinning (u * peak < peak), so the
    # arrivals are the cumulative sums of the seeded generator's first block of exponential gaps
    got = arrivals(rate_profile="0:4", duration=100.0, seed=7)
    gaps = np.random.default_rng(7).exponential(0.25, BLOCK)
    want = np.cumsum(gaps)
    want = want[want < 100.0]
    assert got.tolist() == want.tolist()


def test_zero_rate_segment_has_no_arrivals_and_run_ends():
    a = arrivals(rate_profile="0:0,10:8,20:0.5", duration=30.0, seed=2)
    assert a.min() >= 10.0 and a.max() < 30.0
    inside = np.sum(a < 20.0)
    assert abs(inside - 80) <= 5 * math.sqrt(80)
    a = arrivals(rate_profile="0:0,10:8,20:1e-9", duration=30.0, seed=2)   # ends though late rate ~ 0
    assert a.max() < 20.0


@pytest.mark.parametrize("seed", [0, 11])
def test_counts_per_segment_within_poisson_tolerance(seed):
    w = make_workload("coding", rate_profile="0:5,60:20,120:5", duration=180.0, seed=seed)
    assert w.rps == pytest.approx(10.0)                     # the mean over the run
    assert w.arrivals == "poisson" and "20 req/s from 60 s" in w.describe()
    a = np.array([r.arrival for r in w])
    assert np.all(np.diff(a) >= 0) and a.max() < 180.0
    for lo, hi, rate in ((0, 60, 5), (60, 120, 20), (120, 180, 5)):
        n = np.sum((a >= lo) & (a < hi))
        assert abs(n - rate * (hi - lo)) <= 5 * math.sqrt(rate * (hi - lo)), (lo, n)


def test_sinusoidal_counts_per_quarter():
    a = arrivals("alpaca", rate_profile="sin:40:30:400", duration=1600.0, seed=4)
    p = parse_rate_profile("sin:40:30:400")
    for k in range(16):                                       # quarter periods, 100 s each
        lo, hi = 100 * k, 100 * (k + 1)
        mu = p.expected(lo, hi)
        assert abs(np.sum((a >= lo) & (a < hi)) - mu) <= 5 * math.sqrt(mu), k
    first, second = np.sum(a % 400 < 200), np.sum(a % 400 >= 200)   # high half-period vs low
    assert first > 2 * second


def test_same_seed_same_requests_and_sizes_from_the_workload():
    a = list(make_workload("tetri-hpld", rate_profile="0:3,30:9", duration=60.0, seed=9))
    b = list(make_workload("tetri-hpld", rate_profile="0:3,30:9", duration=60.0, seed=9))
    c = list(make_workload("tetri-hpld", rate_profile="0:3,30:9", duration=60.0, seed=10))
    assert a == b and a != c
    assert all(r.prompt_tokens > 512 and r.output_tokens <= 128 for r in a)


def test_max_requests_and_long_runs_are_lazy():
    w = make_workload("conversation", rate_profile="0:1000,5:50000", max_requests=300_000, seed=1)
    assert w.duration is None and w.rps == 50000
    n = 0
    last = 0.0
    for r in w:
        n += 1
        last = r.arrival
    assert n == 300_000 and last > 5.0


def test_trace_sizes_with_a_profile(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 + "".join(f"{i},{100 + i},{1 + i}\n" for i in range(10)))
    reqs = list(make_workload(str(p), rate_profile="0:2,5:50"))
    assert len(reqs) == 10                                  # as many requests as the trace holds
    assert all(100 <= r.prompt_tokens <= 109 and r.output_tokens == r.prompt_tokens - 99 for r in reqs)
    with pytest.raises(UserError, match="timestamps"):
        make_workload(str(p), rate_profile="0:2", arrivals="trace")
