"""The provisioner on real (short) simulations: its answers equal brute force over the same grid,
the cache makes a re-run free, and Ray gives the same answers as the local pool."""

import json

import pytest

from splitserve.cli import main
from splitserve.provision import plan
from splitserve.provision.command import run_provision
from splitserve.provision.request import ProvisionRequest
from splitserve.provision.evaluate import Cache, Evaluator, LocalBackend

SC = plan.Scenario(workload="coding", duration=30.0, seed=3)
RPS = 12.0


@pytest.fixture
def ev(tmp_path):
    e = Evaluator(LocalBackend(1), Cache(tmp_path / "cache"))
    yield e
    e.close()


def _brute_split(ev, d, rps, P, T, weights):
    ok = [(p, t) for p in range(1, P + 1) for t in range(1, T + 1)
          if ev([SC.job(d.name, (p, t), rps)])[0].slo_met]
    wp, wt = weights
    return min(ok, key=lambda pt: (wp * pt[0] + wt * pt[1], pt[0] + pt[1], pt[0])) if ok else None


@pytest.mark.parametrize("name,objective", [("splitwise-ha", "cost"), ("splitwise-hhcap", "power")])
def test_cheapest_split_equals_brute_force(ev, name, objective):
    d = plan.design(name)
    lim = plan.Limits(max_prompt=6, max_token=4)
    got = plan.cheapest(ev, d, RPS, objective, SC, lim)
    searched = ev.simulated
    weights = plan.unit_values(d, plan.OBJECTIVES[objective][1])
    expect = _brute_split(ev, d, RPS, 6, 4, weights)
    assert expect is not None
    assert (got["prompt_machines"], got["token_machines"]) == expect
    assert got["feasible"] and got["slo_met"]
    assert searched < 6 * 4 == got["brute_force"]


def test_cheapest_baseline_equals_brute_force(ev):
    d = plan.design("baseline-h100")
    got = plan.cheapest(ev, d, RPS, "machines", SC, plan.Limits(max_machines=10))
    ok = [n for n in range(1, 11) if ev([SC.job(d.name, (n,), RPS)])[0].slo_met]
    assert got["machines"] == min(ok)


def test_throughput_at_slo_is_the_edge_of_the_lattice(ev):
    d = plan.design("splitwise-hh")
    rates = plan.RateRange(1.0, 200.0, plan.RateLattice(0.05))
    r = plan.throughput_at_slo(ev, d, (2, 1), SC, rates)
    assert r is not None and 1.0 <= r <= 200.0
    nxt = rates.lattice.rate(rates.lattice.index(r) + 1)
    assert ev([SC.job(d.name, (2, 1), r)])[0].slo_met
    assert not ev([SC.job(d.name, (2, 1), nxt)])[0].slo_met


def test_best_within_budget_equals_brute_force_over_the_boundary(ev):
    d = plan.design("splitwise-hh")
    lim = plan.Limits()
    rates = plan.RateRange(1.0, 200.0, plan.RateLattice(0.05))
    budget = plan.budget_value("4*dgx-h100", "iso-cost")
    assert plan.boundary(d, "iso-cost", budget, lim) == [(1, 3), (2, 2), (3, 1)]
    got = plan.best_within_budget(ev, d, "iso-cost", budget, SC, lim, rates)
    each = {c: plan.throughput_at_slo(ev, d, c, SC, rates) for c in [(1, 3), (2, 2), (3, 1)]}
    assert got["throughput_at_slo"] == max(v for v in each.values() if v is not None)
    assert each[(got["prompt_machines"], got["token_machines"])] == got["throughput_at_slo"]


def test_boundary_and_budget_units():
    d = plan.design("splitwise-ha")          # H100 prompt, A100 token machines
    kw = plan.budget_value("40*dgx-h100", "iso-power")
    assert kw == pytest.approx(40 * 5.6)
    b = plan.boundary(d, "iso-power", kw, plan.Limits())
    assert b[0] == (1, 68) and b[-1] == (39, 1)     # 5.6 kW H100, 3.2 kW A100
    assert all(5.6 * p + 3.2 * t <= kw + 1e-9 < 5.6 * p + 3.2 * (t + 1) or t == 70 for p, t in b)
    assert sorted(plan.spread_order(13)) == list(range(13))
    assert plan.spread_order(13)[0] == 6


def test_cached_rerun_simulates_nothing_and_agrees(tmp_path):
    kw = dict(objective="cost", rps=RPS, constraint=None, budget=None, designs=["splitwise-hh"],
              duration=30.0, seed=3, max_prompt=6, max_token=4, workers=2,
              cache_dir=str(tmp_path / "c"), progress=False)
    first = run_provision(ProvisionRequest(**kw))
    again = run_provision(ProvisionRequest(**kw))
    assert first["search"]["simulated"] > 0
    assert again["search"]["simulated"] == 0
    assert again["search"]["cached"] == first["search"]["simulated"]
    assert again["best"] == first["best"]


def test_ray_backend_matches_local(tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'splitserve[ray]')")
    kw = dict(objective="cost", rps=RPS, constraint=None, budget=None, designs=["splitwise-hh"],
              duration=30.0, seed=3, max_prompt=6, max_token=4, use_cache=False, progress=False)
    local = run_provision(ProvisionRequest(**kw, workers=2))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = run_provision(ProvisionRequest(**kw, backend="ray"))
    finally:
        ray.shutdown()
    assert remote["search"]["backend"] == "ray" and remote["search"]["workers"] == 2
    assert remote["best"] == local["best"]
    assert remote["search"]["simulated"] == local["search"]["simulated"]


def test_infeasible_names_the_closest_design(tmp_path, capsys):
    code = main(["provision", "--objective", "cost", "--rps", "70", "--duration", "20",
                 "--design", "splitwise-hh", "--design", "baseline-h100", "--max-prompt", "2",
                 "--max-token", "1", "--max-machines", "2", "--cache-dir", str(tmp_path), "--json"])
    assert code == 1
    cap = capsys.readouterr()
    res = json.loads(cap.out)
    assert res["best"] is None and res["closest"]["design"] in ("splitwise-hh", "baseline-h100")
    line = cap.err.strip().splitlines()[-1]
    assert line.startswith("error: no design meets all nine SLOs at 70 req/s")
    assert "closest: " in line and "slowdown" in line


@pytest.mark.parametrize("args,needle", [
    (["--objective", "cost"], "needs --rps"),
    (["--objective", "cost", "--rps", "-3"], "--rps must be a positive"),
    (["--objective", "fastest", "--rps", "3"], "--objective must be"),
    (["--constraint", "iso-power"], "needs --constraint iso-power|iso-cost and --budget"),
    (["--constraint", "iso-watts", "--budget", "3"], "--constraint must be"),
    (["--constraint", "iso-power", "--budget", "lots"], "--budget 'lots'"),
    (["--constraint", "iso-power", "--budget", "40*dgx-z100"], "unknown hardware"),
    (["--objective", "cost", "--rps", "5", "--design", "splitwise-zz"], "unknown design"),
    (["--objective", "cost", "--rps", "5", "--max-token", "0"], "--max-token must be at least 1"),
    (["--objective", "cost", "--rps", "5", "--workload", "nope"], "nope"),
    ([], "say what to optimise"),
])
def test_bad_input_is_one_error_line(args, needle, capsys):
    assert main(["provision", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err


def test_machines_objective_picks_the_fewest(tmp_path):
    res = run_provision(ProvisionRequest(objective="machines", rps=RPS, designs=("splitwise-ha", "baseline-a100"),
                                         duration=30.0, seed=3, max_prompt=6, max_token=4, max_machines=12,
                                         workers=1, cache_dir=str(tmp_path), progress=False))
    counts = [r["machine_count"] for r in res["designs"] if r["feasible"]]
    assert counts and res["best"]["machine_count"] == min(counts)
    assert res["best"]["objective_value"] == res["best"]["machine_count"]


def test_batch_objective_picks_the_most_requests_per_dollar(ev):
    d = plan.design("splitwise-hh")
    budget = plan.budget_value("4*dgx-h100", "iso-cost")
    got = plan.batch_within_budget(ev, d, "iso-cost", budget, SC, plan.Limits(), stress_rps=60.0)
    per_dollar = {c: (o.throughput_rps / o.cost_per_hour)
                  for c in [(1, 3), (2, 2), (3, 1)] for o in ev([SC.job(d.name, c, 60.0)])}
    best = max(per_dollar, key=per_dollar.get)
    assert (got["prompt_machines"], got["token_machines"]) == best
    assert got["requests_per_dollar"] == pytest.approx(per_dollar[best] * 3600)
    assert got["simulations"] == 3


def test_cheapest_under_distserves_slo_equals_brute_force(ev):
    """With goodput SLOs the SLO is DistServe's (90% of requests within TTFT and TPOT); the search
    still equals brute force over the same grid."""
    sc = plan.Scenario(workload="coding", duration=30.0, seed=3, goodput=(0.5, 0.06))
    d = plan.design("splitwise-ha")
    lim = plan.Limits(max_prompt=5, max_token=4)
    got = plan.cheapest(ev, d, RPS, "cost", sc, lim)
    outs = {(p, t): ev([sc.job(d.name, (p, t), RPS)])[0] for p in range(1, 6) for t in range(1, 5)}
    assert all(o.worst == "goodput_attainment" for o in outs.values())
    wp, wt = plan.unit_values(d, plan.OBJECTIVES["cost"][1])
    ok = [c for c, o in outs.items() if o.slo_met]
    assert ok and not all(o.slo_met for o in outs.values())   # the SLO separates the grid
    expect = min(ok, key=lambda pt: (wp * pt[0] + wt * pt[1], pt[0] + pt[1], pt[0]))
    assert (got["prompt_machines"], got["token_machines"]) == expect
