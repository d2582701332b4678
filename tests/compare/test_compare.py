"""`splitserve compare` end to end at a tiny scale, its goodputs re-simulated at the lattice edge,
and the split search against brute force on a tiny budget."""

import json
import time

import pytest

from splitserve.cli import main
from splitserve.compare.budget import Budget
from splitserve.compare.claims import load_claims
from splitserve.compare.command import curve_rates, run_compare
from splitserve.compare.request import CompareRequest
from splitserve.compare.goodput import system_goodput
from splitserve.policy.systems import SYSTEMS
from splitserve.provision.evaluate import Evaluator, LocalBackend, run_job
from splitserve.provision.plan import RateRange, Scenario, boundary
from splitserve.provision.search import RateLattice

TINY = dict(machines=3, duration=20.0, tolerance=0.1, curve_points=2, workers=2, use_cache=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    lines = []
    res = run_compare(CompareRequest(out=out, command="splitserve compare (test)", **TINY), log=lines.append)
    return out, res, lines


def test_tiny_run_writes_every_system_and_its_report(tiny):
    out, res, lines = tiny
    saved = json.loads((out / "results.json").read_text())
    text = (out / "report.md").read_text()
    names = [r["system"] for r in saved["systems"]]
    assert names == list(SYSTEMS)                       # every system of SYSTEMS, at run time
    # a line per finished system, and one for the reference (the unsplit machines, default policy)
    assert len([m for m in lines if ": goodput " in m]) == len(SYSTEMS) + 1
    assert any(m.startswith("reference (default policy): goodput ") for m in lines)
    ref = saved["reference"]
    assert ref["design"] == "baseline-h100" and ref["cluster"] == [3] and ref["at_goodput"]["meets"]
    assert ref["next_rps"] > ref["goodput_rps"] and ref["next_slo_met"] is False and ref["next_ratio"] > 1
    assert f"`baseline-h100` under the default policy (Splitwise's baseline: mixed continuous batching, JSQ): " \
           f"goodput {ref['goodput_rps']:.4g} req/s" in text
    assert (out / "goodput.png").stat().st_size > 5_000 and (out / "latency.png").stat().st_size > 5_000
    assert "splitserve compare (test)" in text.splitlines()[5]           # the command at the top
    for r in saved["systems"]:
        assert r["goodput_rps"] is not None, r["system"]                # 3 H100s carry 0.5 req/s
        row = next(line for line in text.splitlines() if line.startswith(f"| {r['system']} |"))
        assert f"| {r['goodput_rps']:.4g} |" in row
        assert (len(r["cluster"]) == 2) == SYSTEMS[r["system"]].split and sum(r["cluster"]) == 3
        m = r["at_goodput"]
        assert m["meets"] and m["slo_met"] and m["checks_met"] == m["checks"] == 9
        # cost per million output tokens: the budget's $/h over the tokens per hour generated
        assert m["cost_per_hour"] == pytest.approx(3 * 38.0)
        assert m["cost_per_m_output_tokens"] == pytest.approx(
            m["cost_per_hour"] / (m["output_tokens"] / m["simulated_s"] * 3600) * 1e6)
    assert set(saved["curves"]) == set(SYSTEMS) and all(len(v) == 2 for v in saved["curves"].values())


def test_each_goodput_meets_the_slos_and_the_next_lattice_rate_does_not(tiny):
    _, res, _ = tiny
    lattice = RateLattice(TINY["tolerance"])
    for r in res["systems"]:
        sc = Scenario("coding", TINY["duration"], 0, "llama2-70b", system=r["system"])
        g = r["goodput_rps"]
        k = lattice.index(g)
        assert lattice.rate(k) == g                                     # a lattice rate
        at, nxt = (run_job(sc.job(r["design"], tuple(r["cluster"]), x)) for x in (g, lattice.rate(k + 1)))
        assert at.slo_met, r["system"]
        assert not nxt.slo_met, r["system"]
        assert r["next_rps"] == lattice.rate(k + 1) and r["next_slo_met"] is False
        assert r["next_worst"] == nxt.worst and r["next_ratio"] == nxt.violation > 1


def test_the_split_search_finds_the_brute_force_best_split():
    """Budget of 4 H100s: every split (1,3), (2,2), (3,1), every lattice rate from 0.5 req/s up to
    each split's first miss, simulated one by one; the search's goodput is the best of those edges
    and its split reaches it."""
    budget = Budget("dgx-h100", 4)
    lattice = RateLattice(0.15)
    rates = RateRange(0.5, 60.0, lattice)
    split_systems = [s for s in SYSTEMS.values() if s.split]
    assert split_systems
    for s in split_systems:
        sc = Scenario("coding", 15.0, 0, "llama2-70b", system=s.name)
        edge = {}
        for counts in budget.splits():
            k, last = lattice.index(rates.lo), None
            while lattice.rate(k) <= rates.hi and run_job(sc.job("splitwise-hh", counts, lattice.rate(k))).slo_met:
                last, k = lattice.rate(k), k + 1
            edge[counts] = last
        best = max(v for v in edge.values() if v is not None)
        ev = Evaluator(LocalBackend(1))
        r = system_goodput(ev, s, budget, Scenario("coding", 15.0, 0, "llama2-70b"), rates)
        assert r["goodput_rps"] == best, (s.name, edge, r)
        assert edge[tuple(r["cluster"])] == best
        assert r["candidates"] == 3


def test_the_budget_is_provisions_iso_cost_boundary():
    b = Budget("dgx-h100", 5)
    assert b.splits() == [(1, 4), (2, 3), (3, 2), (4, 1)]
    assert boundary(b.design(True), "iso-cost", b.cost_per_hour, b.limits()) == b.splits()
    assert boundary(b.design(False), "iso-cost", b.cost_per_hour, b.limits()) == [(5,)]
    assert (b.design(True).name, b.design(False).name) == ("splitwise-hh", "baseline-h100")
    assert Budget("dgx-a100", 2).design(True).name == "splitwise-aa"


def test_curve_rates_span_a_quarter_to_one_and_a_half_of_the_best_goodput():
    assert curve_rates(10.0, 6) == [2.5, 5.0, 7.5, 10.0, 12.5, 15.0]
    assert curve_rates(10.0, 0) == [] and curve_rates(0.0, 6) == []


def test_claims_name_systems_that_exist():
    for name, c in load_claims().items():
        assert c.baseline == "" or c.baseline in SYSTEMS, name
        assert c.paper and c.section and c.claim


@pytest.mark.parametrize("argv, msg", [
    (["compare", "--machines", "1"], "--machines must be at least 2"),
    (["compare", "--system", "nope"], "unknown --system 'nope'"),
    (["compare", "--hardware", "dgx-h100-cap"], "no unsplit design of dgx-h100-cap machines"),
    (["compare", "--goodput-ttft", "1"], "give both --goodput-ttft and --goodput-tpot"),
    (["compare", "--tolerance", "0"], "--tolerance must be in (0, 1)"),
])
def test_mistakes_are_one_error_line(argv, msg, capsys, tmp_path):
    assert main(argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and msg in err[0]
    assert not (tmp_path / "report.md").exists()


def test_an_unwritable_out_fails_before_any_simulation(capsys, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    t0 = time.perf_counter()
    assert main(["compare", "--out", str(f / "sub")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: Not a directory") and time.perf_counter() - t0 < 5   # a full run takes > 60 s


def test_a_goodput_at_the_ceiling_is_flagged(tmp_path):
    lines = []
    res = run_compare(CompareRequest(out=tmp_path, command="c", systems=("vllm",), max_rps=1.0,
                                     **{**TINY, "curve_points": 0}), log=lines.append)
    (r,) = res["systems"]
    lattice = RateLattice(TINY["tolerance"])
    assert r["goodput_rps"] == lattice.rate(lattice.index(1.0)) and r["at_ceiling"] and r["next_rps"] is None
    assert any("at the search's ceiling 1 req/s" in m for m in lines)
    assert "above the ceiling: raise --max-rps" in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "latency.png").exists()


def test_with_distserve_slos_goodput_is_the_last_rate_with_90_percent_attainment(tmp_path):
    res = run_compare(CompareRequest(out=tmp_path, command="c", systems=("vllm", "distserve"), goodput_ttft=2.0,
                                     goodput_tpot=0.1, **{**TINY, "curve_points": 0}))
    lattice = RateLattice(TINY["tolerance"])
    for r in res["systems"]:
        m = r["at_goodput"]
        assert m["attainment"] >= 0.9 and m["meets"], r["system"]
        sc = Scenario("coding", TINY["duration"], 0, "llama2-70b", goodput=(2.0, 0.1), system=r["system"])
        nxt = run_job(sc.job(r["design"], tuple(r["cluster"]), lattice.rate(lattice.index(r["goodput_rps"]) + 1)))
        assert nxt.attainment < 0.9 and not nxt.slo_met and r["next_worst"] == "goodput_attainment"
    assert "attain (target 90%)" in (tmp_path / "report.md").read_text()


def test_on_conversations_each_system_reports_its_prefix_cache_hit_rate(tmp_path):
    # multiturn's later turns carry their history: every system's machines' caches (with prefix-aware
    # routing, the default) give most of it back; the table shows the rate beside the latencies
    res = run_compare(CompareRequest(out=tmp_path, command="c", systems=("vllm", "splitwise"), workload="multiturn",
                                     **{**TINY, "curve_points": 0}))
    for r in res["systems"]:
        assert 0.5 < r["at_goodput"]["prefix_hit_rate"] < 1.0, r["system"]
    report = (tmp_path / "report.md").read_text()
    assert "| $ per M output tokens | prefix-cache hit rate | TTFT P50 / P99 (ms) |" in report
