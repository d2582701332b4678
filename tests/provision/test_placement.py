"""DistServe's placement searches (provision/placement/) against brute force on a small grid:
every candidate's goodput from a simulation at EVERY lattice rate (no monotone search), the best
goodput per GPU picked by the same rule."""

import math

import pytest

from splitserve.provision import placement as pl
from splitserve.provision.evaluate import Evaluator, LocalBackend
from splitserve.provision.search import RateLattice

SC = pl.Scenario("opt-13b", "sharegpt", ttft=0.2, tpot=0.1, requests=60, min_duration=5.0,
                 nodes=2, tps=(1, 2), max_pp=2, lattice=RateLattice(0.3), lo_rps=1.0, hi_rps=40.0)
RPS = 25.0


@pytest.fixture(scope="module")
def ev():
    e = Evaluator(LocalBackend(2))
    yield e
    e.close()


def brute_goodput(ev, make) -> float:
    """Highest lattice rate in [lo, hi] whose simulation meets the SLO, every rate simulated."""
    lat = SC.lattice
    rates = [lat.rate(k) for k in range(lat.index(SC.lo_rps), lat.index(SC.hi_rps) + 1)]
    ok = [r for r, o in zip(rates, ev([make(r) for r in rates])) if o.slo_met]
    return max(ok, default=0.0)


def best(rows):
    return min((r for r in rows if r[-1] > 0), key=lambda r: (-r[-1] / r[0],) + tuple(r[:-1]))


@pytest.fixture(scope="module")
def alg1(ev):
    return pl.high_affinity(ev, SC, RPS)


@pytest.fixture(scope="module")
def alg2(ev):
    return pl.low_affinity(ev, SC, RPS)


def test_candidates_are_the_grid():
    assert pl.phase_candidates(SC) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert pl.pair_candidates(SC) == [(pp, a, b) for pp in (1, 2) for a in (1, 2) for b in (1, 2)]


def test_high_affinity_equals_brute_force(ev, alg1):
    pre, dec = [], []
    for tp, pp in pl.phase_candidates(SC):
        pre.append((tp * pp, tp, pp, brute_goodput(ev, lambda r, tp=tp, pp=pp: pl.prefill_job(SC, tp, pp, r))))
        dec.append((tp * pp, tp, pp, brute_goodput(ev, lambda r, tp=tp, pp=pp: pl.decode_job(SC, tp, pp, r))))
    assert [c["goodput"] for c in alg1["prefill_candidates"]] == [g for *_, g in pre]
    assert [c["goodput"] for c in alg1["decode_candidates"]] == [g for *_, g in dec]
    bp, bd = best(pre), best(dec)
    assert (alg1["prefill"]["tp"], alg1["prefill"]["pp"]) == (bp[1], bp[2])
    assert (alg1["decode"]["tp"], alg1["decode"]["pp"]) == (bd[1], bd[2])


def test_low_affinity_equals_brute_force(ev, alg2):
    rows = [((a + b) * pp, pp, a, b, brute_goodput(ev, lambda r, pp=pp, a=a, b=b: pl.pair_job(SC, pp, a, b, r)))
            for pp, a, b in pl.pair_candidates(SC)]
    assert [c["goodput"] for c in alg2["candidates"]] == [g for *_, g in rows]
    b = best(rows)
    assert (alg2["pair"]["pp"], alg2["pair"]["tp_p"], alg2["pair"]["tp_d"]) == b[1:4]


def test_replication_counts(alg1, alg2):
    assert alg1["feasible"] and alg2["feasible"]
    assert alg1["prefill_instances"] == math.ceil(RPS / alg1["prefill"]["goodput"])
    assert alg1["decode_instances"] == math.ceil(RPS / alg1["decode"]["goodput"])
    assert alg1["gpus"] == (alg1["prefill_instances"] * alg1["prefill"]["gpus"]
                            + alg1["decode_instances"] * alg1["decode"]["gpus"])
    assert alg2["pairs"] == math.ceil(RPS / alg2["pair"]["goodput"])
    assert alg2["pairs"] * alg2["pair"]["goodput"] >= RPS > (alg2["pairs"] - 1) * alg2["pair"]["goodput"]


def test_colocated_pair_moves_kv_over_nvlink():
    from splitserve.catalog import load_hardware
    from splitserve.sim.kv_transfer import link_between

    a100 = load_hardware("dgx-a100")
    assert link_between(a100, a100, colocated=True).bandwidth == a100.nvlink_gbs * 1e9 / 2
    assert link_between(a100, a100).bandwidth == a100.ib_gbs * 1e9
    assert pl.pair_job(SC, 1, 1, 1, 2.0).colocated and not pl.prefill_job(SC, 1, 1, 2.0).colocated


def test_a_model_that_does_not_fit_is_no_candidate():
    big = pl.Scenario("opt-66b", "sharegpt", 0.4, 0.1, nodes=1, tps=(1, 2, 4), max_pp=1)
    assert pl.phase_candidates(big) == [(2, 1), (4, 1)]   # 131 GB of weights: not on one A100-80GB
    assert pl.pair_candidates(big) == [(1, 2, 2), (1, 2, 4), (1, 4, 2), (1, 4, 4)]
