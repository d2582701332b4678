"""Before a provisioning search: the most simulations it can take and a time for them; after it: a
warning where an optimum sits on the search boundary (issue 17, item 5)."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.cli import main
from splitserve.provision import plan
from splitserve.provision.command import (SECONDS_PER_REQUEST, boundary_warnings, estimate,
                                          simulation_bound, worst_probes)
from splitserve.provision.search import Oracle, first_true, max_rate, min_split


def test_worst_probes_by_hand():
    # one probe per round (binary search): 70 points need at most 7 probes, as ceil(log2(71)) = 7
    assert [worst_probes(n, 1) for n in (1, 2, 3, 7, 70)] == [1, 2, 2, 3, 7]
    # width 2 splits [lo, hi] in three: n = 8 -> probes at 3, 6 -> a third of 2 points -> 2 more
    assert worst_probes(8, 2) == 4


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 80), width=st.integers(1, 5), x=st.integers(1, 81))
def test_first_true_never_tests_more_than_worst_probes(n, width, x):
    tested = []
    first_true(1, n, lambda pts: tested.extend(pts) or [p >= x for p in pts], width)
    assert len(tested) <= worst_probes(n, width)


@settings(max_examples=60, deadline=None)
@given(P=st.integers(1, 12), T=st.integers(1, 12), width=st.integers(1, 4),
       edge=st.lists(st.integers(1, 14), min_size=12, max_size=12), wp=st.integers(1, 5),
       wt=st.integers(1, 5))
def test_the_split_bound_holds_on_random_staircases(P, T, width, edge, wp, wt):
    # feasible iff t >= need(p), need non-increasing in p: a monotone staircase (some infeasible)
    need = sorted(edge, reverse=True)
    oracle = Oracle(lambda pts: [t >= need[p - 1] for p, t in pts])
    min_split(oracle, P, T, lambda p, t: (wp * p + wt * t, p + t, p), width)
    d = plan.design("splitwise-hh")
    bound = simulation_bound("cost", d, plan.Limits(P, T, 1), plan.RateRange(), width)
    assert oracle.asked + 1 <= bound                        # + the answer's own simulation


@settings(max_examples=40, deadline=None)
@given(width=st.integers(1, 4), top=st.floats(0.5, 3000.0))
def test_the_rate_search_stays_within_its_share_of_the_bound(width, top):
    rates = plan.RateRange(0.5, 2000.0, plan.RateLattice(0.02))
    asked = []
    max_rate(lambda rs: asked.extend(rs) or [r <= top for r in rs], rates.lattice, rates.lo, rates.hi, width)
    assert len(asked) <= worst_probes(rates.size(), width)


def test_estimate_by_hand():
    lim = plan.Limits(3, 2, 10)
    sc = plan.Scenario(duration=20.0)
    hh, base = plan.design("splitwise-hh"), plan.design("baseline-h100")
    est = estimate("cost", [hh, base], sc, lim, plan.RateRange(), 1, 6.0, None, None)
    # split: W(3) + W(2) + 3 * W(2) + 1 = 2 + 2 + 6 + 1; unsplit: W(10) + 1 = 4 + 1
    assert est["simulations_at_most"] == 11 + 5
    assert est["seconds_per_simulation"] == 6.0 * 20.0 * SECONDS_PER_REQUEST
    assert est["seconds_for_all"] == 16 * 6.0 * 20.0 * SECONDS_PER_REQUEST
    # throughput within 4 DGX-H100 of power: splits (1, 3), (2, 2), (3, 1): 3 candidates
    rates = plan.RateRange(1.0, 8.0, plan.RateLattice(0.5))   # rates 1, 1.5, ... 7.59: 6 of them
    budget = plan.budget_value("4*dgx-h100", "iso-power")
    thr = estimate("throughput", [hh], sc, plan.Limits(3, 3, 10), rates, 1, None, "iso-power", budget)
    assert rates.size() == 6 and thr["simulations_at_most"] == 3 * (1 + worst_probes(6, 1)) + 1
    assert math.isclose(thr["seconds_per_simulation"], math.sqrt(8.0) * 20.0 * SECONDS_PER_REQUEST)


def provision(capsys, *args):
    code = main(["provision", "--objective", "cost", "--rps", "6", "-d", "splitwise-hh", "--max-prompt", "3",
                 "--duration", "20", "--no-cache", "--json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), err


def test_the_boundary_warning_fires_only_at_max_token(capsys):
    # 6 req/s of coding for 20 s: the cheapest Splitwise-HH split is 2P + 1T (measured), found
    # with one token machine allowed and with three
    res, err = provision(capsys, "--max-token", "1")
    best = res["best"]
    assert (best["prompt_machines"], best["token_machines"]) == (2, 1)
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert warnings == ["warning: splitwise-hh with 2P + 1T: 1 token machines = --max-token: the optimum "
                        "sits on the search boundary, a wider search may find a better one"]
    assert res["warnings"] == [warnings[0][len("warning: "):]]
    assert best["on_boundary"] == ["1 token machines = --max-token"]
    # the estimate came first, on stderr, and bounds what the search did: W(3)+W(1)+3*W(1)+1 = 8
    # with 2 workers (W(3) = 3 with two probes a round)
    first = err.splitlines()[0]
    assert first.startswith("provisioning 1 design: at most ") and "upper bound" in first
    assert res["estimate"]["simulations_at_most"] == int(first.split("at most ")[1].split()[0].replace(",", ""))
    assert res["search"]["simulated"] <= res["estimate"]["simulations_at_most"]

    res, err = provision(capsys, "--max-token", "3")
    assert (res["best"]["prompt_machines"], res["best"]["token_machines"]) == (2, 1)
    assert res["warnings"] == [] and "warning:" not in err and "on_boundary" not in res["best"]
    assert res["search"]["simulated"] <= res["estimate"]["simulations_at_most"]


def test_quiet_prints_no_estimate_but_still_warns(capsys):
    _, err = provision(capsys, "--max-token", "1", "-q")
    assert [line.split(":")[0] for line in err.splitlines()] == ["warning"]


def _res(objective, rows, **extra):
    return {"objective": objective, "limits": {"max_prompt": 4, "max_token": 3, "max_machines": 8},
            "designs": rows, **extra}


def test_boundary_rules_by_hand():
    at_prompt = {"design": "splitwise-hh", "feasible": True, "prompt_machines": 4, "token_machines": 1}
    inside = {"design": "splitwise-hh", "feasible": True, "prompt_machines": 3, "token_machines": 2}
    base = {"design": "baseline-h100", "feasible": True, "machines": 8}
    infeasible = {"design": "splitwise-aa", "feasible": False, "prompt_machines": 4, "token_machines": 3}
    w = boundary_warnings(_res("cost", [at_prompt, inside, base, infeasible]))
    assert [x.split(":")[0] for x in w] == ["splitwise-hh with 4P + 1T", "baseline-h100 with 8 machines"]
    # within a budget: a pool at its limit warns only where one more of its machines would fit
    full = lambda r: (False, False)
    assert boundary_warnings(_res("batch", [dict(at_prompt), dict(base)]), full) == []
    assert len(boundary_warnings(_res("batch", [dict(at_prompt)]), lambda r: (True, False))) == 1
    # throughput at the top of the rate range
    top = {"design": "splitwise-hh", "feasible": True, "prompt_machines": 2, "token_machines": 1,
           "throughput_at_slo": 19.5}
    (msg,) = boundary_warnings(_res("throughput", [top], rate_top=19.5), full)
    assert "19.5 req/s = the top of the rate range (--max-rps)" in msg
    assert boundary_warnings(_res("throughput", [dict(top, throughput_at_slo=19.1)], rate_top=19.5), full) == []
