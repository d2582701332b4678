"""The Vidur-style configuration search: each configuration's capacity equals a brute-force scan
of the rate lattice, the Pareto front is what no other configuration beats, and the grid leaves
out what cannot hold the model."""

import pytest

from splitserve.provision import configs, plan
from splitserve.provision.evaluate import Cache, Evaluator, LocalBackend

SC = plan.Scenario(workload="coding", duration=20.0, seed=5, model="llama2-7b",
                   goodput=(1.0, 0.05))
RATES = plan.RateRange(1.0, 120.0, plan.RateLattice(0.5))


@pytest.fixture
def ev(tmp_path):
    e = Evaluator(LocalBackend(2), Cache(tmp_path / "cache"))
    yield e
    e.close()


def test_capacities_and_front_equal_brute_force(ev):
    d = plan.design("baseline-a100")
    cands, skipped = configs.grid("llama2-7b", ["dgx-a100"], [1, 2], [1], ["vllm", "sarathi"], [0, 8], [256])
    assert len(cands) == 2 * 2 * 2 and not skipped
    assert {c.chunk for c in cands if c.scheduler == "sarathi"} == {256}
    got = configs.search(ev, d, (1,), SC, cands, RATES)
    searched = ev.simulated
    caps = {r["label"]: r["capacity_rps"] for r in got["configs"]}
    brute = {c.label(): configs.brute_force_capacity(ev, d, (1,), SC, c, RATES) for c in cands}
    assert caps == brute
    assert len(set(caps.values())) > 1                     # the grid separates the configurations
    assert searched < len(cands) * RATES.size()
    # the front: no configuration is cheaper and at least as capable, or as cheap and more capable
    rows = [r for r in got["configs"] if r["capacity_rps"]]
    for f in (r for r in rows if r["pareto"]):
        assert not any((r["cost_per_hour"] < f["cost_per_hour"] and r["capacity_rps"] >= f["capacity_rps"])
                       or (r["cost_per_hour"] <= f["cost_per_hour"] and r["capacity_rps"] > f["capacity_rps"])
                       for r in rows)
    best = got["best"]
    assert best["capacity_per_dollar"] == max(r["capacity_rps"] / r["cost_per_hour"] for r in rows)
    # tp 2 costs twice tp 1: an instance pays for its GPUs
    by = {(r["tp"], r["scheduler"], r["batch_cap"]): r for r in got["configs"]}
    assert by[(2, "vllm", 0)]["cost_per_hour"] == pytest.approx(2 * by[(1, "vllm", 0)]["cost_per_hour"])


def test_pareto_by_hand():
    rows = [{"label": k, "cost_per_hour": c, "capacity_rps": q} for k, c, q in
            [("a", 1, 2.0), ("b", 2, 1.5), ("c", 2, 3.0), ("d", 4, 3.0), ("e", 4, 5.0), ("f", 3, None)]]
    assert [r["label"] for r in configs.pareto(rows)] == ["a", "c", "e"]


def test_chunk_sizes_per_scheduler():
    cands, _ = configs.grid("llama2-7b", ["dgx-a100"], [1], [1], ["splitwise", "sarathi", "orca"], [0], [0, 256])
    assert sorted((c.scheduler, c.chunk) for c in cands) == [
        ("orca", 0), ("sarathi", 256), ("sarathi", 512), ("splitwise", 0), ("splitwise", 256)]


def test_grid_leaves_out_what_does_not_fit():
    cands, skipped = configs.grid("llama2-70b", ["dgx-a100"], [1, 2, 8], [1, 2], ["vllm"], [0], [])
    # 138 GB of weights: one A100 (72 GB usable) cannot hold them, two can (as tp 2 or pp 2)
    assert {(c.tp, c.pp) for c in cands} == {(1, 2), (2, 1), (2, 2), (8, 1), (8, 2)}
    assert [(s["tp"], s["pp"]) for s in skipped] == [(1, 1)]
    with pytest.raises(Exception, match="unknown machine scheduler"):
        configs.grid("llama2-70b", ["dgx-a100"], [8], [1], ["nope"], [0], [])
