"""A simulation's machines, built from its cluster's pools: each with its instance kind's step-time
model (perf/step.py, from the `Hosts` it runs on: sim/hosts.py), power model and stats."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..cluster.designs import ClusterSpec
from ..perf import PowerModel
from ..perf.step import StepModel
from ..policy.kv_allocation import configure
from ..policy.machine import BatchingConfig
from ..policy.state import Machine
from .hosts import Hosts
from .metrics import MachineStats


@dataclass(slots=True)
class Machines:
    """The machines by id, and each one's step-time model and power model; each instance kind's spec
    (with cost_per_hour and power_kw, for the report) and the source of its perf model."""

    machines: list[Machine] = field(default_factory=list)
    steps: list[StepModel] = field(default_factory=list)
    power: list[PowerModel] = field(default_factory=list)
    hw: dict[str, object] = field(default_factory=dict)
    perf_sources: dict[str, str] = field(default_factory=dict)


def build_machines(cluster: ClusterSpec, hosts: Hosts, batching: BatchingConfig, block_size: int,
                   stats: list[MachineStats]) -> Machines:
    """`cluster`'s machines, pool by pool, each following `batching`'s KV allocation (on demand: the
    engine's paged blocks of `block_size` tokens); a MachineStats each appended to `stats`."""
    out = Machines()
    kinds: dict[str, StepModel] = {}
    for inst, pool, count in cluster.groups:
        name = inst.name
        step = kinds.get(name)
        if step is None:
            out.hw[name], step = hosts.instance(inst, out.machines)
            kinds[name] = step
            out.perf_sources[name] = step.perf.source
        cap = step.kv_capacity
        for _ in range(count):
            m = Machine(id=len(out.machines), hardware=name, home=pool, kv_capacity=cap, stages=inst.pp)
            configure(m, batching, block_size)
            out.machines.append(m)
            out.steps.append(step)
            out.power.append(step.power)
            stats.append(MachineStats(name, pool.name.lower(), kv_capacity=cap))
    return out
