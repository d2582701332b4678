"""The simulator times batches only through the step-time model it is given (sim/hosts.py Hosts,
perf/step.py StepModel): a toy one whose every step takes one second, whose KV link has a fixed
half second and whose serving path adds a quarter second gives token times computed by hand."""

from __future__ import annotations

import pytest

from splitserve.catalog import load_model
from splitserve.cluster.designs import make_cluster
from splitserve.sim.kv_transfer import Link
from splitserve.sim.simulator import SimConfig, Simulation
from splitserve.twin.machine import NoPower
from splitserve.workload import RequestSpec


class Flat(NoPower):
    """A perf and power model where everything takes one second and draws nothing (NoPower)."""

    source = "flat"
    attention = 0.0

    def prompt_time(self, tokens: int) -> float:
        return 1.0

    def token_time(self, batch: int, context: int) -> float:
        return 1.0


class OneSecondStep:
    perf = power = Flat()
    kv_capacity = 1 << 20

    def __init__(self) -> None:
        self.steps = 0

    def batch_time(self, m, batch) -> float:
        self.steps += 1
        return 1.0

    def stage_time(self, batch) -> float:
        raise AssertionError("no pipeline here")

    def context(self, batch) -> int:
        return batch.context


class ToyHosts:
    reference = Flat()
    request_overhead = 0.25

    def __init__(self) -> None:
        self.step = OneSecondStep()
        self.links: list[tuple[str, str]] = []

    def instance(self, inst, machines):
        return inst, self.step

    def kv_link(self, src: str, dst: str) -> Link:
        self.links.append((src, dst))
        return Link(bandwidth=float("inf"), overhead=0.5)


def run(cluster, hosts: ToyHosts, out: int = 3):
    sim = Simulation(cluster, load_model("llama2-70b"), [RequestSpec(0.0, 100, out)],
                     SimConfig(machine=hosts, record_requests=True))
    res = sim.run()
    (r,) = res.requests
    return res, r


def test_unsplit_request_takes_one_second_per_step():
    hosts = ToyHosts()
    res, r = run(make_cluster("baseline-a100", machines=1), hosts)
    assert r.token_times == [1.0, 2.0, 3.0]           # the prefill, then two decode steps
    assert hosts.step.steps == 3 and hosts.links == []
    assert res.metrics.ttft.mean == pytest.approx(1.25)   # + the serving path
    assert res.metrics.e2e.mean == pytest.approx(3.25)
    assert res.perf_sources == {res.cluster.groups[0][0].name: "flat"}


def test_split_request_waits_for_the_link():
    hosts = ToyHosts()
    res, r = run(make_cluster("splitwise-aa", prompt_machines=1, token_machines=1), hosts)
    assert r.token_times == [1.0, 2.5, 3.5]           # the KV lands at 1.5 s (serialized: 100 < 512 tokens)
    assert len(hosts.links) == 1
    assert res.metrics.transfers == 1
