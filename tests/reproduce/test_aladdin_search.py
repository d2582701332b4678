"""Aladdin's search for the fewest workers, made cheaper without changing an answer: a run stops
once its attainment can no longer reach the target, and the P100 counterfactual starts from the
main runs at its rate. Both ways at the tiny scale: the same GPUs for every system and rate, and
for every counterfactual; a stopped run's recorded attainment bounds the whole run's from above."""

from dataclasses import replace

import pytest

from splitserve.reproduce import aladdin_counterfactuals, aladdin_experiments
from splitserve.reproduce.aladdin_experiments import FIG11, FIG12, GPUS, TARGET, TINY, needed, simulate

SC = replace(TINY, perf_model="roofline")


def _searches(rates) -> dict:
    res = {"rates": list(rates), "gpus": {}, "runs": {}}
    for kind in FIG11 + FIG12:
        res["gpus"][kind], res["runs"][kind] = [], []
        for rate in rates:
            runs: dict = {}
            n = needed(kind, rate, SC, 0, runs)
            res["gpus"][kind].append(None if n is None else n * GPUS.get(kind, 1))
            res["runs"][kind].append({str(k): v for k, v in runs.items()})
    return res


@pytest.fixture(scope="module")
def both():
    mp = pytest.MonkeyPatch()
    mp.setattr(aladdin_experiments, "simulate",       # before: every run to its end
               lambda *a, stop_below=None, **kw: simulate(*a, **kw))
    try:
        old = _searches(SC.rates)
        rate = aladdin_counterfactuals.cf_rate(old)
        old_cf = aladdin_counterfactuals.run(SC, 0, rate, lambda m: None)
    finally:
        mp.undo()
    new = _searches(SC.rates)
    return old, old_cf, new, aladdin_counterfactuals.run(SC, 0, rate, lambda m: None, new)


def test_same_answers_both_ways(both):
    old, old_cf, new, new_cf = both
    assert new["gpus"] == old["gpus"]
    assert new_cf["variants"] == old_cf["variants"]
    stopped = [(kind, i, n) for kind, per in new["runs"].items() for i, runs in enumerate(per)
               for n, run in runs.items() if run.get("stopped")]
    assert stopped, "no run stopped early: the tiny scale no longer tests the stop"
    for kind, i, n in stopped:                      # the bound is a bound, and below the target
        assert old["runs"][kind][i][n]["attainment"] <= new["runs"][kind][i][n]["attainment"] < TARGET
    for kind, per in new["runs"].items():           # the same probes; a run that was not stopped is the same run
        for i, runs in enumerate(per):
            assert runs.keys() == old["runs"][kind][i].keys()
            for n, run in runs.items():
                if not run.get("stopped"):
                    assert run == old["runs"][kind][i][n]


def test_p100_reuses_the_main_runs(both):
    old, old_cf, new, new_cf = both
    i = new["rates"].index(new_cf["rate"])
    p100 = new_cf["runs"]["P100 (every request)"]
    for kind in aladdin_counterfactuals.KINDS:
        main = new["runs"][kind][i]
        assert all(p100[kind][n] == run for n, run in main.items())    # read again, not run again
    fresh = sum(len(v) for v in old_cf["runs"]["P100 (every request)"].values())
    assert sum(len(v) for v in p100.values()) - sum(len(new["runs"][k][i]) for k in p100) < fresh


def test_a_stopped_run_could_not_have_met_the_target():
    whole = simulate("jsq", 1, 6.0, SC, 0)
    cut = simulate("jsq", 1, 6.0, SC, 0, stop_below=TARGET)
    assert cut["stopped"] and whole["attainment"] <= cut["attainment"] < TARGET
    assert "stopped" not in simulate("jsq", 8, 6.0, SC, 0, stop_below=TARGET)   # one that meets it runs out
