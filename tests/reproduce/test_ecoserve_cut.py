"""EcoServe's cut sweeps (the full scale's): a system's sweep stops after two successive rates past
every reading's limit, and what is read off the runs made equals what the whole grid gives: the
sustained rate at every limit, the gains, the sustained_by_limit readings; the rates not run are
absent from results.json and said 'overloaded, not run' in the report."""

import json
from dataclasses import replace

import pytest

from splitserve.reproduce.ecoserve import reproduce_ecoserve
from splitserve.reproduce.ecoserve_claims import claims, mean_ssr
from splitserve.reproduce.ecoserve_experiments import (FULL, LATENCY_FACTOR, LIMIT_FACTORS, QUICK, SCALES, TINY,
                                                       dataset_results, paper, sustained)

# vLLM reserving the context (Orca's scheduler, 7 requests at once) is overloaded from 10 req/s on
SMALL = replace(TINY, name="tiny", rates={"alpaca": (5.0, 10.0, 20.0, 40.0, 80.0)}, perf_model="roofline")


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    out = tmp_path_factory.mktemp("ecoserve-cut")
    mp = pytest.MonkeyPatch()
    mp.setitem(SCALES, "tiny", replace(SMALL, cut=True))
    try:
        path = reproduce_ecoserve(out, scale="tiny", log=lambda m: None, perf_model="roofline")
    finally:
        mp.undo()
    res = json.loads((out / "results.json").read_text())
    whole = dataset_results("alpaca", SMALL, 0, lambda m: None)
    return res, whole, path.read_text()


def test_only_the_full_scale_cuts():
    assert FULL.cut and not QUICK.cut and not TINY.cut


def test_cut_sweep_reads_the_same_as_the_whole_grid(both):
    res, whole, _ = both
    (cut,) = res["datasets"]
    rates = whole["rates"]
    assert cut["rates"] == rates and not whole["not_run"]
    assert cut["not_run"], "the small scale must cut something for this test to mean anything"
    top = max(LATENCY_FACTOR, *LIMIT_FACTORS) * whole["points"]["vllm"][0]["norm_latency"]
    assert cut["cut_limit"] == pytest.approx(top)
    for s, ps in whole["points"].items():
        got = cut["points"][s]
        assert got == json.loads(json.dumps(ps[:len(got)]))       # the runs made are the whole grid's
        assert cut["not_run"].get(s, []) == rates[len(got):]
        if len(got) < len(rates):                                  # cut: after two successive past the top
            assert [p["norm_latency"] > top for p in got[-2:]] == [True, True]
            assert not any(a["norm_latency"] > top and b["norm_latency"] > top for a, b in zip(got[:-2], got[1:-1]))
    for key in ("sustained", "ecoserve_gain", "sustained_by_limit", "latency_limit", "slo_basis"):
        assert cut[key] == json.loads(json.dumps(whole[key])), key       # equal, not approximately
    # every limit read, both ways: sustained() off the runs made equals it off the whole grid
    base = whole["points"]["vllm"][0]["norm_latency"]
    for s, ps in whole["points"].items():
        for f in (LATENCY_FACTOR, *LIMIT_FACTORS):
            full = sustained(tuple(rates), [p["norm_latency"] for p in ps], f * base)
            short = sustained(tuple(rates), [p["norm_latency"] for p in cut["points"][s]], f * base)
            assert short == full, (s, f)


def test_absent_points_are_said_not_run_and_ssr_compares_the_rates_both_ran(both):
    res, whole, text = both
    (cut,) = res["datasets"]
    s, missing = next(iter(cut["not_run"].items()))
    assert f"| {missing[0]:g} | " in text and "overloaded, not run" in text
    assert res["simulations"] == sum(len(ps) for ps in cut["points"].values()) < 5 * len(cut["points"])
    k = len(cut["points"][s])
    eco = sum(p["ssr"] for p in cut["points"]["ecoserve"][:k]) / k
    assert mean_ssr(res, "ecoserve", s) == pytest.approx(eco)
    assert mean_ssr(res, "ecoserve") == pytest.approx(sum(p["ssr"] for p in cut["points"]["ecoserve"])
                                                      / len(cut["points"]["ecoserve"]))
    assert {c.key for c in claims(res, paper())} >= {"alpaca rate over vllm", "ssr over vllm"}
