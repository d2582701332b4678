"""What the simulator runs on: for each instance kind its step-time model (perf/step.py), the KV link
between two machine kinds, the uncontended model SLO slowdowns are measured against, and what
the serving path adds to each request. `SimConfig.machine` injects one; `CatalogHosts`, the
catalog's machines, is the default, and a measured machine (twin/machine.py MachineProfile) is the
other."""

from __future__ import annotations

from typing import Protocol

from ..catalog import Catalog, ModelSpec, kv_capacity_tokens, load_hardware
from ..cluster.instance import Instance, InstanceSpec, instance_spec
from ..perf import PerfModel, make_perf_model
from ..perf.step import PerfStep, StepModel
from ..policy.state import Machine
from .kv_transfer import Link, link_between

REFERENCE_HARDWARE = "dgx-a100"     # SLOs are slowdowns against an uncontended DGX-A100 (Table VI)


class Hosts(Protocol):
    @property
    def reference(self) -> PerfModel:
        """A request alone: its SLO slowdowns' denominator."""

    @property
    def request_overhead(self) -> float:
        """Seconds the serving path adds to each request's first token, once."""

    # (optional) reserves_between_steps: a split request's prompt waits for its token machine's
    # step in flight to end, as serve's reservation does (sim/reservation.py); absent: at once

    def instance(self, inst: Instance, machines: list[Machine]) -> tuple[object, StepModel]:
        """(its spec, with cost_per_hour and power_kw, for the report; the step-time model) of an
        instance kind; `machines`: the simulation's machines (filled as it builds them)."""

    def kv_link(self, src: str, dst: str) -> Link:
        """The link a KV transfer takes from a machine of kind `src` to one of kind `dst`."""


class CatalogHosts:
    """The catalog's machines: each instance kind's profile, operator or roofline model (perf/; its
    decodes read by `decode_lookup`, perf/decode_lookup.py, the SLO reference's too), its KV
    capacity at `memory_utilization`, the links between the kinds (sim/kv_transfer.py, NVLink
    with `colocated`), SLOs against a DGX-A100, and no serving path."""

    request_overhead = 0.0

    def __init__(self, model: ModelSpec, profile: str | None = None, memory_utilization: float = 0.9,
                 colocated: bool = False, catalog: Catalog | None = None, perf_model: str = "auto",
                 decode_lookup: str = "batch-size") -> None:
        self.model, self.profile, self.memory_utilization = model, profile, memory_utilization
        self.colocated, self.catalog, self.perf_model = colocated, catalog, perf_model
        self.decode_lookup = decode_lookup
        self.reference, _ = make_perf_model(model, load_hardware(REFERENCE_HARDWARE), None, profile, kind=perf_model,
                                            decode_lookup=decode_lookup)
        self.specs: dict[str, InstanceSpec] = {}

    def instance(self, inst: Instance, machines: list[Machine]) -> tuple[object, StepModel]:
        spec = instance_spec(inst, self.catalog)
        perf, power = make_perf_model(self.model, spec.hw, inst.tp, self.profile, inst.pp, inst.ep, self.perf_model,
                                      self.decode_lookup)
        cap = kv_capacity_tokens(self.model, spec.hw, inst.tp, self.memory_utilization, inst.pp)
        self.specs[inst.name] = spec
        return spec, PerfStep(perf, power, cap)

    def kv_link(self, src: str, dst: str) -> Link:
        return link_between(self.specs[src].hw, self.specs[dst].hw, self.colocated, self.catalog)
