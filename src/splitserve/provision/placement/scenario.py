"""What every simulation of one DistServe placement search shares (`Scenario`: model, workload,
SLOs, machine kind, the grid of parallelisms), the catalog entries it names, and the parallelisms
each algorithm considers: tensor degrees within a node, pipeline stages, the weights fitting."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...catalog import Catalog, HardwareSpec, ModelSpec, kv_capacity_tokens, load_hardware, load_model
from ...cluster.designs import load_designs
from ...errors import UserError
from ..search import RateLattice


@dataclass(frozen=True, slots=True)
class Scenario:
    """What every simulation of one placement search shares."""
    model: str
    workload: str
    ttft: float                    # TTFT SLO, s
    tpot: float                    # TPOT SLO, s
    hardware: str = "dgx-a100"
    requests: int = 400            # requests per probe: duration = max(min_duration, requests / rate)
    min_duration: float = 20.0
    seed: int = 0
    profile: str | None = None
    max_context: int | None = None  # default: the model's context
    nodes: int = 4                 # N: node limit per instance (Alg. 1), pipeline stages (Alg. 2)
    tps: tuple[int, ...] | None = None   # tensor degrees to consider (default 1, 2, 4, ... per node)
    max_pp: int | None = None      # pipeline degrees 1..max_pp (default: as many as the nodes allow)
    helpers: int = 4               # full-node instances of the other phase in a phase search
    lattice: RateLattice = field(default_factory=lambda: RateLattice(0.05))
    lo_rps: float = 0.05
    hi_rps: float = 64.0
    scheduler: str | None = None   # machine scheduler by name (None: the default batching)
    catalog: Catalog | None = None  # --catalog: machines, models, designs (None: the built-in one)

    def duration(self, rps: float) -> float:
        return max(self.min_duration, self.requests / rps)


def split_designs(sc: Scenario) -> tuple[str, str]:
    """The split design and the baseline whose machines are all `sc.hardware`."""
    hardware, split, base = sc.hardware, None, None
    for name, d in sorted(load_designs(sc.catalog).items()):
        if d.split and d.prompt == hardware and d.token == hardware and split is None:
            split = name
        if not d.split and d.machine == hardware and base is None:
            base = name
    if split is None or base is None:
        raise UserError(f"no split design and baseline of {hardware} in catalog/designs.toml")
    return split, base


def hardware_of(sc: Scenario) -> HardwareSpec:
    return load_hardware(sc.hardware, sc.catalog)


def model_of(sc: Scenario) -> ModelSpec:
    return load_model(sc.model, sc.catalog)


def fits(sc: Scenario, tp: int, pp: int) -> bool:
    """The model's weights (and activation reserve) fit a tp x pp instance."""
    m = model_of(sc)
    if pp > m.layers:
        return False
    try:
        kv_capacity_tokens(m, hardware_of(sc), tp, 0.9, pp=pp)
    except UserError:
        return False
    return True


def tensor_degrees(sc: Scenario) -> list[int]:
    per_node = hardware_of(sc).gpus
    if sc.tps is not None:
        return [t for t in sc.tps if 1 <= t <= per_node]
    return [t for t in (1, 2, 4, 8, 16) if t <= per_node]


def full_node(sc: Scenario) -> tuple[int, int]:
    """The helper instance: every GPU of a node in tensor parallel, the fewest stages that fit."""
    tp = hardware_of(sc).gpus
    for pp in range(1, sc.nodes + 1):
        if fits(sc, tp, pp):
            return tp, pp
    raise UserError(f"{sc.model} does not fit {sc.nodes} nodes of {sc.hardware}")


def context_of(sc: Scenario) -> int:
    return sc.max_context or model_of(sc).max_context


def phase_candidates(sc: Scenario) -> list[tuple[int, int]]:
    """Alg. 1's parallelisms: tp within a node, pp up to nodes * GPUs per node / tp, fitting."""
    per_node = hardware_of(sc).gpus
    out = []
    for tp in tensor_degrees(sc):
        top = sc.nodes * per_node // tp
        if sc.max_pp is not None:
            top = min(top, sc.max_pp)
        out += [(tp, pp) for pp in range(1, top + 1) if fits(sc, tp, pp)]
    return out


def pair_candidates(sc: Scenario) -> list[tuple[int, int, int]]:
    """Alg. 2's (pp, tp_p, tp_d): pp stages in pp nodes, tp_p + tp_d GPUs of each node."""
    per_node = hardware_of(sc).gpus
    tps = tensor_degrees(sc)
    top = sc.nodes if sc.max_pp is None else min(sc.nodes, sc.max_pp)
    return [(pp, a, b) for pp in range(1, top + 1) for a in tps for b in tps
            if a + b <= per_node and fits(sc, a, pp) and fits(sc, b, pp)]
