"""The runs that back the "why" of each Aladdin claim: at one rate (`cf_rate`),
the fewest workers of each system again with one thing changed from the main runs.

- The paper's SLOs: Table 2's 600 ms TTFT and 30 ms ATGT for Llama2-13B on its A100, in place of
  the same rules applied to our perf model (slos()); Aladdin's placement packs to them too.
- P100: every request within both SLOs (the paper's count, §6.4) in place of >= 99%.
- PCIe: the default vLLM's 4-GPU worker with its tensor-parallel all-reduces over PCIe, as the
  paper's testbed joins its A100s (§6.1; docs/perf-model.md), added to the NVLink all-reduces the
  step model has: 2 per layer of the batch's tokens x hidden x 2 bytes, a ring's 2 (n - 1) / n of
  them at PCIE_GBS each way plus PCIE_LATENCY_S each (both ASSUMED, PCIe 4.0 x16 in practice).
"""

from __future__ import annotations

from typing import Any

from ..catalog import load_model
from ..sim.hosts import CatalogHosts
from .aladdin_experiments import GPUS, MODEL, needed, paper

PCIE_GBS = 20.0              # GB/s a ring all-reduce step moves over PCIe 4.0 x16 (ASSUMED)
PCIE_LATENCY_S = 20e-6       # seconds per all-reduce (ASSUMED)
KINDS = ("vllm", "jsq", "aladdin-0.7", "split-jsq", "split-p2", "split-aladdin")


def cf_rate(res: dict) -> float:
    """The rate the counterfactuals run at: the highest of the main runs' at which every system of
    KINDS met the target (so each reduction has both its numbers), else the lowest."""
    ok = [r for i, r in enumerate(res["rates"]) if all(res["gpus"][k][i] is not None for k in KINDS)]
    return max(ok) if ok else min(res["rates"])


class _Slower:
    """A step model whose batches take `fixed` + `per_token` x their tokens seconds more."""

    __slots__ = ("inner", "perf", "power", "kv_capacity", "fixed", "per_token")

    def __init__(self, inner, fixed: float, per_token: float) -> None:
        self.inner, self.fixed, self.per_token = inner, fixed, per_token
        self.perf, self.power, self.kv_capacity = inner.perf, inner.power, inner.kv_capacity

    def batch_time(self, m, batch) -> float:
        return self.inner.batch_time(m, batch) + self.fixed + self.per_token * (batch.prompt_tokens + batch.decodes)

    def stage_time(self, batch) -> float:
        return self.inner.stage_time(batch) + self.fixed + self.per_token * (batch.prompt_tokens + batch.decodes)

    def context(self, batch) -> int:
        return self.inner.context(batch)


class PcieHosts(CatalogHosts):
    """The catalog's machines, each instance of tp > 1 paying PCIe all-reduces on top."""

    def instance(self, inst, machines):
        spec, step = super().instance(inst, machines)
        if inst.tp < 2:
            return spec, step
        m = self.model
        n = 2 * m.layers                                            # all-reduces per step
        per_token = n * m.hidden * m.dtype_bytes * 2 * (inst.tp - 1) / inst.tp / (PCIE_GBS * 1e9)
        return spec, _Slower(step, n * PCIE_LATENCY_S, per_token)


def pcie_hosts(perf_model: str) -> PcieHosts:
    return PcieHosts(load_model(MODEL), None, 0.9, False, None, perf_model)


def run(scale, seed: int, rate: float, log=print, main: dict | None = None) -> dict:
    """At `rate`: {"rate", "variants": {name: {kind: GPUs or None}}, "runs": {name: {kind: {workers: run}}}}.
    With `main` (the main runs' results, which hold `rate`), P100 starts from the main runs there:
    the same simulations, read against another target (a run stopped below 99% is below 100%)."""
    pub = paper()["setup"]
    variants: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
        "paper's SLOs (600 ms / 30 ms)": (KINDS, {"slo": (pub["ttft_slo_s"], pub["atgt_slo_s"])}),
        "P100 (every request)": (KINDS, {"target": 1.0}),
        "vLLM's 4-GPU worker over PCIe": (("vllm",), {"hosts": pcie_hosts(scale.perf_model)}),
    }
    out: dict = {"rate": rate, "variants": {}, "runs": {}}
    for name, (kinds, kw) in variants.items():
        out["variants"][name], out["runs"][name] = {}, {}
        for kind in kinds:
            runs: dict = {}
            if main is not None and set(kw) == {"target"}:
                runs = {int(k): v for k, v in main["runs"][kind][main["rates"].index(rate)].items()}
            n = needed(kind, rate, scale, seed, runs, **kw)
            out["variants"][name][kind] = None if n is None else n * GPUS.get(kind, 1)
            out["runs"][name][kind] = {str(k): v for k, v in sorted(runs.items())}
            log(f"counterfactual {name}: {kind} at {rate:g} req/s: {n} workers ({len(runs)} simulations)")
    return out
