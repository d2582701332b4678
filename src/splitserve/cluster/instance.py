"""A model instance: the GPUs that hold one copy of the model and serve as one machine of a pool.

An instance runs on `tp * pp` GPUs of one hardware kind of the catalog: `tp` GPUs of one node in
tensor parallel (their all-reduces go over NVLink: perf/roofline.py), and `pp` such groups in a
pipeline (layers split into `pp` stages; activations hop between stages over NVLink when the
instance fits in one node, else over the nodes' network: perf/pipeline.py). The default instance
is the catalog machine itself: tp = all its GPUs, pp = 1, named as the machine.

An instance pays for the GPUs it holds: cost and provisioned power are the machine's, pro rata
(`gpus / hw.gpus` machines), so goodput per GPU and capacity per dollar compare instances of any
size (DistServe, Vidur). The simulator treats an instance as one `policy.state.Machine`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import Catalog, HardwareSpec, load_hardware
from ..errors import UserError


@dataclass(frozen=True, slots=True)
class Instance:
    hardware: str         # machine kind (catalog/hardware.toml, or a measured machine: twin/)
    tp: int               # tensor-parallel GPUs, within one machine
    pp: int = 1           # pipeline stages
    machine_gpus: int = 1  # GPUs of one machine of this kind
    ep: int = 1           # expert parallel (a mixture of experts: experts spread over the tp GPUs)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def name(self) -> str:
        """The machine's name for the default instance (all GPUs of one machine, tensor parallel),
        else `hardware/tpNppM`."""
        if self.pp == 1 and self.tp == self.machine_gpus and self.ep == 1:
            return self.hardware
        return f"{self.hardware}/tp{self.tp}pp{self.pp}" + (f"ep{self.ep}" if self.ep > 1 else "")


def make_instance(hardware: str, tp: int | None = None, pp: int | None = None, ep: int | None = None,
                  catalog: Catalog | None = None) -> Instance:
    """The instance of `tp` x `pp` GPUs of `hardware` (tp default: all GPUs of one machine; pp
    default 1; hardware of `catalog`, default the built-in one); UserError names the option to fix."""
    hw = load_hardware(hardware, catalog)
    tp = hw.gpus if tp is None else tp
    pp = 1 if pp is None else pp
    if not 1 <= tp <= hw.gpus:
        raise UserError(f"tensor parallel {tp} must be between 1 and {hw.gpus} (the GPUs of one {hardware}); "
                        f"use pipeline stages (--pp) to span machines")
    if pp < 1:
        raise UserError(f"pipeline stages must be at least 1, got {pp}")
    if ep is not None and ep < 1:
        raise UserError(f"expert parallel must be at least 1, got {ep}")
    return Instance(hardware, tp, pp, hw.gpus, ep or 1)


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """An instance with its hardware's figures, as the simulator and the reports use it."""

    instance: Instance
    hw: HardwareSpec

    @property
    def name(self) -> str:
        return self.instance.name

    @property
    def machines(self) -> float:
        """Machines' worth of GPUs the instance holds (0.5 for 4 GPUs of an 8-GPU machine)."""
        return self.instance.gpus / self.hw.gpus

    @property
    def nodes(self) -> int:
        """Machines the instance spans (a pipeline of more GPUs than one machine has)."""
        return -(-self.instance.gpus // self.hw.gpus)

    @property
    def cost_per_hour(self) -> float:
        return self.hw.cost_per_hour * self.machines

    @property
    def power_kw(self) -> float:
        return self.hw.power_kw * self.machines


def instance_spec(instance: Instance, catalog: Catalog | None = None) -> InstanceSpec:
    return InstanceSpec(instance, load_hardware(instance.hardware, catalog))
