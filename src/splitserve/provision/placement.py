"""DistServe's placement searches (seed 002, paper 0, §4.1 Alg. 1 and §4.2 Alg. 2): the parallelism
of the prefill (prompt) and decoding (token) instances that maximises goodput per GPU, then
replication to a request rate.

Goodput of a configuration: the highest request rate (on a `RateLattice`, searched with
`search.max_rate`, every probe a cached `Evaluator` job) at which at least 90% of requests meet
the goodput SLOs (report/goodput.py), divided by the GPUs the configuration holds. Every
simulation is a Splitwise-style split cluster of one catalog machine kind with no mixed pool
(DistServe's pools never lend machines) and FCFS batching.

- Alg. 1, high node-affinity (`high_affinity`): KV moves over the machines' network (the catalog's
  `ib_gbs`), so the phases are searched apart. For each parallelism (tp GPUs of one node x pp
  stages, tp * pp <= nodes * GPUs per node, the weights must fit: catalog.kv_capacity_tokens)
  `simu_prefill` is the max rate of ONE prompt instance of it with `helpers` full-node token
  instances (decode never limits) at >= 90% TTFT attainment (TPOT SLO infinite); `simu_decode` is
  the max rate of ONE token instance with `helpers` full-node prompt instances at >= 90% attainment
  of both SLOs. Both SLOs there because in this simulator a request waits for room in its token
  machine's KV before its prompt runs (policy.cluster.admit), so a saturated decoder shows as TTFT,
  where DistServe's decoder queues after the first token (a known difference). The best goodput
  per GPU of each phase is replicated: n = ceil(R / prefill goodput), m = ceil(R / decode goodput).
- Alg. 2, low node-affinity (`low_affinity`): prefill and decoding segments of one pipeline stage
  share a node, so KV moves over NVLink (`Job.colocated`, sim/kv_transfer.link_between). For each
  pp in 1..nodes and each (tp_p, tp_d) with tp_p + tp_d <= GPUs per node, both fitting with pp
  stages, the max rate of the pair (1 prompt + 1 token instance) meeting both SLOs; the best per
  GPU is replicated: n = ceil(R / pair goodput) pairs.

Results are plain dicts (JSON-ready), with the goodput of every candidate and the simulations run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import UserError
from .evaluate import Evaluator, Job
from .search import RateLattice, max_rate

if TYPE_CHECKING:
    from ..catalog import Catalog

INF = float("inf")


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


def _designs(sc: Scenario) -> tuple[str, str]:
    """The split design and the baseline whose machines are all `sc.hardware`."""
    from ..designs import load_designs

    hardware, split, base = sc.hardware, None, None
    for name, d in sorted(load_designs(sc.catalog).items()):
        if d.split and d.prompt == hardware and d.token == hardware and split is None:
            split = name
        if not d.split and d.machine == hardware and base is None:
            base = name
    if split is None or base is None:
        raise UserError(f"no split design and baseline of {hardware} in catalog/designs.toml")
    return split, base


def _hw(sc: Scenario):
    from ..catalog import load_hardware
    return load_hardware(sc.hardware, sc.catalog)


def _model(sc: Scenario):
    from ..catalog import load_model
    return load_model(sc.model, sc.catalog)


def fits(sc: Scenario, tp: int, pp: int) -> bool:
    """The model's weights (and activation reserve) fit a tp x pp instance."""
    from ..catalog import kv_capacity_tokens

    m = _model(sc)
    if pp > m.layers:
        return False
    try:
        kv_capacity_tokens(m, _hw(sc), tp, 0.9, pp=pp)
    except UserError:
        return False
    return True


def tensor_degrees(sc: Scenario) -> list[int]:
    per_node = _hw(sc).gpus
    if sc.tps is not None:
        return [t for t in sc.tps if 1 <= t <= per_node]
    return [t for t in (1, 2, 4, 8, 16) if t <= per_node]


def full_node(sc: Scenario) -> tuple[int, int]:
    """The helper instance: every GPU of a node in tensor parallel, the fewest stages that fit."""
    tp = _hw(sc).gpus
    for pp in range(1, sc.nodes + 1):
        if fits(sc, tp, pp):
            return tp, pp
    raise UserError(f"{sc.model} does not fit {sc.nodes} nodes of {sc.hardware}")


def _max_context(sc: Scenario) -> int:
    return sc.max_context or _model(sc).max_context


# ---- the jobs ------------------------------------------------------------------------------
def prefill_job(sc: Scenario, tp: int, pp: int, rps: float) -> Job:
    """One prompt instance (tp, pp) behind `helpers` full-node token instances; TTFT only."""
    htp, hpp = full_node(sc)
    return Job(_designs(sc)[0], 1, sc.helpers, None, rps, sc.workload, sc.duration(rps), sc.seed,
               sc.model, sc.profile, (sc.ttft, INF), parallel=(None, None, tp, pp, htp, hpp),
               scheduler=sc.scheduler, mixed_pool=False, max_context=_max_context(sc), catalog=sc.catalog)


def decode_job(sc: Scenario, tp: int, pp: int, rps: float) -> Job:
    """One token instance (tp, pp) behind `helpers` full-node prompt instances; both SLOs."""
    htp, hpp = full_node(sc)
    return Job(_designs(sc)[0], sc.helpers, 1, None, rps, sc.workload, sc.duration(rps), sc.seed,
               sc.model, sc.profile, (sc.ttft, sc.tpot), parallel=(None, None, htp, hpp, tp, pp),
               scheduler=sc.scheduler, mixed_pool=False, max_context=_max_context(sc), catalog=sc.catalog)


def pair_job(sc: Scenario, pp: int, tp_p: int, tp_d: int, rps: float, slo: tuple[float, float] | None = None,
             pairs: int = 1) -> Job:
    """`pairs` x (1 prompt + 1 token instance), stage segments colocated (KV over NVLink)."""
    return Job(_designs(sc)[0], pairs, pairs, None, rps, sc.workload, sc.duration(rps), sc.seed,
               sc.model, sc.profile, slo or (sc.ttft, sc.tpot), parallel=(None, None, tp_p, pp, tp_d, pp),
               scheduler=sc.scheduler, mixed_pool=False, colocated=True, max_context=_max_context(sc), catalog=sc.catalog)


def split_job(sc: Scenario, prefill: tuple[int, int], decode: tuple[int, int], n: int, m: int, rps: float,
              slo: tuple[float, float] | None = None) -> Job:
    """The replicated Alg. 1 placement: n prompt and m token instances, KV over the network."""
    return Job(_designs(sc)[0], n, m, None, rps, sc.workload, sc.duration(rps), sc.seed,
               sc.model, sc.profile, slo or (sc.ttft, sc.tpot), parallel=(None, None, *prefill, *decode),
               scheduler=sc.scheduler, mixed_pool=False, max_context=_max_context(sc), catalog=sc.catalog)


def colocated_job(sc: Scenario, tp: int, rps: float, slo: tuple[float, float] | None = None,
                  machines: int = 1, scheduler: str | None = None) -> Job:
    """The vLLM baseline: `machines` unsplit instances of tp GPUs (pp 1) batching both phases."""
    return Job(_designs(sc)[1], None, None, machines, rps, sc.workload, sc.duration(rps), sc.seed,
               sc.model, sc.profile, slo or (sc.ttft, sc.tpot), parallel=(tp, 1, None, None, None, None),
               scheduler=scheduler, mixed_pool=True, max_context=_max_context(sc), catalog=sc.catalog)


# ---- goodput -------------------------------------------------------------------------------
def goodput(ev: Evaluator, sc: Scenario, make) -> float:
    """Max lattice rate at which `make(rate)`'s simulation meets its goodput SLO (0.0: not even
    the lowest rate)."""
    def test(rates: list[float]) -> list[bool]:
        return [o.slo_met for o in ev([make(r) for r in rates])]

    r = max_rate(test, sc.lattice, sc.lo_rps, sc.hi_rps, width=ev.width)
    return r or 0.0


def _best(rows: list[dict]) -> dict | None:
    """Highest goodput per GPU; ties to fewer GPUs, then smaller tp, then fewer stages."""
    ok = [r for r in rows if r["goodput"] > 0]
    return min(ok, key=lambda r: (-r["per_gpu"], r["gpus"], r.get("tp", 0), r.get("pp", 0),
                                  r.get("tp_p", 0), r.get("tp_d", 0))) if ok else None


def phase_candidates(sc: Scenario) -> list[tuple[int, int]]:
    """Alg. 1's parallelisms: tp within a node, pp up to nodes * GPUs per node / tp, fitting."""
    per_node = _hw(sc).gpus
    out = []
    for tp in tensor_degrees(sc):
        top = sc.nodes * per_node // tp
        if sc.max_pp is not None:
            top = min(top, sc.max_pp)
        out += [(tp, pp) for pp in range(1, top + 1) if fits(sc, tp, pp)]
    return out


def pair_candidates(sc: Scenario) -> list[tuple[int, int, int]]:
    """Alg. 2's (pp, tp_p, tp_d): pp stages in pp nodes, tp_p + tp_d GPUs of each node."""
    per_node = _hw(sc).gpus
    tps = tensor_degrees(sc)
    top = sc.nodes if sc.max_pp is None else min(sc.nodes, sc.max_pp)
    return [(pp, a, b) for pp in range(1, top + 1) for a in tps for b in tps
            if a + b <= per_node and fits(sc, a, pp) and fits(sc, b, pp)]


def _count(ev: Evaluator) -> int:
    return ev.simulated + ev.cached


def high_affinity(ev: Evaluator, sc: Scenario, rps: float) -> dict:
    """Alg. 1: the best prefill and decode parallelism apart, each replicated to `rps`."""
    start = _count(ev)
    pre, dec = [], []
    for tp, pp in phase_candidates(sc):
        gp = goodput(ev, sc, lambda r, tp=tp, pp=pp: prefill_job(sc, tp, pp, r))
        gd = goodput(ev, sc, lambda r, tp=tp, pp=pp: decode_job(sc, tp, pp, r))
        pre.append({"tp": tp, "pp": pp, "gpus": tp * pp, "goodput": gp, "per_gpu": gp / (tp * pp)})
        dec.append({"tp": tp, "pp": pp, "gpus": tp * pp, "goodput": gd, "per_gpu": gd / (tp * pp)})
    bp, bd = _best(pre), _best(dec)
    res = {"algorithm": "high-affinity", "model": sc.model, "workload": sc.workload, "rps": rps,
           "slo": {"ttft_s": sc.ttft, "tpot_s": sc.tpot}, "prefill": bp, "decode": bd,
           "prefill_candidates": pre, "decode_candidates": dec}
    if bp is None or bd is None:
        res.update(feasible=False, simulations=_count(ev) - start)
        return res
    n, m = math.ceil(rps / bp["goodput"]), math.ceil(rps / bd["goodput"])
    gpus = n * bp["gpus"] + m * bd["gpus"]
    res.update(feasible=True, prefill_instances=n, decode_instances=m, gpus=gpus,
               goodput_per_gpu=min(n * bp["goodput"], m * bd["goodput"]) / gpus,
               simulations=_count(ev) - start)
    return res


def low_affinity(ev: Evaluator, sc: Scenario, rps: float) -> dict:
    """Alg. 2: the best colocated (pp, tp_p, tp_d) pair, replicated to `rps`."""
    start = _count(ev)
    rows = []
    for pp, a, b in pair_candidates(sc):
        g = goodput(ev, sc, lambda r, pp=pp, a=a, b=b: pair_job(sc, pp, a, b, r))
        gpus = (a + b) * pp
        rows.append({"pp": pp, "tp_p": a, "tp_d": b, "gpus": gpus, "goodput": g, "per_gpu": g / gpus})
    best = _best(rows)
    res = {"algorithm": "low-affinity", "model": sc.model, "workload": sc.workload, "rps": rps,
           "slo": {"ttft_s": sc.ttft, "tpot_s": sc.tpot}, "pair": best, "candidates": rows}
    if best is None:
        res.update(feasible=False, simulations=_count(ev) - start)
        return res
    n = math.ceil(rps / best["goodput"])
    res.update(feasible=True, prefill={"tp": best["tp_p"], "pp": best["pp"]},
               decode={"tp": best["tp_d"], "pp": best["pp"]}, pairs=n, prefill_instances=n,
               decode_instances=n, gpus=n * best["gpus"], goodput_per_gpu=best["per_gpu"],
               simulations=_count(ev) - start)
    return res


def vllm_plus_plus(ev: Evaluator, sc: Scenario, scheduler: str | None = None) -> dict:
    """vLLM++ (§6.4): the colocated baseline at its best tensor degree (pp 1: vLLM has no
    inter-op parallelism), by goodput per GPU."""
    rows = []
    for tp in tensor_degrees(sc):
        if fits(sc, tp, 1):
            g = goodput(ev, sc, lambda r, tp=tp: colocated_job(sc, tp, r, scheduler=scheduler))
            rows.append({"tp": tp, "pp": 1, "gpus": tp, "goodput": g, "per_gpu": g / tp})
    return {"best": _best(rows), "candidates": rows}


# ---- `splitserve provision --objective goodput-per-gpu` ------------------------------------
PLACEMENTS = ("high-affinity", "low-affinity")


def run_placement(*, placement: str, rps: float | None, model: str, workload: str,
                  goodput_ttft: float | None, goodput_tpot: float | None, hardware: str = "dgx-a100",
                  nodes: int = 4, max_pp: int | None = None, requests: int = 400, seed: int = 0,
                  profile: str | None = None, tolerance: float = 0.05, min_rps: float = 0.05,
                  max_rps: float = 256.0, workers: int | None = None, cache_dir: str | None = None,
                  use_cache: bool = True, catalog: Catalog | None = None) -> dict:
    """Check the question, run Alg. 1 or Alg. 2 on a local process pool (cached), return the
    result with the search's cost. `catalog`: --catalog (None: the built-in one)."""
    import time
    from pathlib import Path

    from ..report.goodput import from_options
    from .evaluate import Cache, LocalBackend, default_cache_dir

    if placement not in PLACEMENTS:
        raise UserError(f"--placement must be high-affinity or low-affinity, got {placement!r}")
    if rps is None or not (math.isfinite(rps) and rps > 0):
        raise UserError("--objective goodput-per-gpu needs --rps R > 0: the rate to replicate to")
    slo = from_options(goodput_ttft, goodput_tpot)
    if slo is None:
        raise UserError("--objective goodput-per-gpu needs --goodput-ttft and --goodput-tpot (s)")
    for flag, v in (("--nodes", nodes), ("--probe-requests", requests)):
        if v < 1:
            raise UserError(f"{flag} must be at least 1, got {v}")
    if max_pp is not None and max_pp < 1:
        raise UserError(f"--max-pp must be at least 1, got {max_pp}")
    if not (0 < tolerance < 1) or not (0 < min_rps < max_rps):
        raise UserError("need 0 < --tolerance < 1 and 0 < --min-rps < --max-rps")
    from ..workload import make_workload
    make_workload(workload, rps=1.0, duration=1.0)          # unknown workloads fail here
    sc = Scenario(model, workload, slo.ttft_s, slo.tpot_s, hardware=hardware, requests=requests, seed=seed,
                  profile=profile, nodes=nodes, max_pp=max_pp, lattice=RateLattice(tolerance),
                  lo_rps=min_rps, hi_rps=max_rps, catalog=catalog)
    full_node(sc)                                          # the model fits at all
    cache = Cache(Path(cache_dir) if cache_dir else default_cache_dir()) if use_cache else None
    ev = Evaluator(LocalBackend(workers), cache)
    t0 = time.perf_counter()
    try:
        res = (high_affinity if placement == "high-affinity" else low_affinity)(ev, sc, rps)
    finally:
        ev.close()
    res.update(objective="goodput-per-gpu", hardware=hardware, nodes=nodes,
               search={"simulated": ev.simulated, "cached": ev.cached, "wall_s": time.perf_counter() - t0,
                       "workers": ev.width, "probe_requests": requests, "rate_tolerance": tolerance})
    return res


def _par(c: dict | None, tp: str = "tp") -> str:
    return "-" if c is None else f"tp{c[tp]} pp{c['pp']}"


def print_placement(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    slo = res["slo"]
    head = (f"DistServe {res['algorithm']} placement | {res['model']} | {res['workload']} | "
            f"90% within TTFT {slo['ttft_s']:g} s, TPOT {slo['tpot_s']:g} s | {res['rps']:g} req/s")
    tab = Table(title=head, title_justify="left")
    if res["algorithm"] == "high-affinity":
        for col in ("phase", "tp", "pp", "GPUs", "goodput req/s", "per GPU"):
            tab.add_column(col, justify="right")
        for phase in ("prefill", "decode"):
            best = res[phase]
            for c in res[f"{phase}_candidates"]:
                mark = "* " if c is best else "  "
                tab.add_row(mark + phase, str(c["tp"]), str(c["pp"]), str(c["gpus"]),
                            f"{c['goodput']:.3g}", f"{c['per_gpu']:.3g}")
    else:
        for col in ("pp", "prefill tp", "decode tp", "GPUs", "goodput req/s", "per GPU"):
            tab.add_column(col, justify="right")
        for c in res["candidates"]:
            mark = "* " if c is res["pair"] else "  "
            tab.add_row(mark + str(c["pp"]), str(c["tp_p"]), str(c["tp_d"]), str(c["gpus"]),
                        f"{c['goodput']:.3g}", f"{c['per_gpu']:.3g}")
    con.print(tab)
    s = res["search"]
    con.print(f"[dim]{s['simulated']} simulations ({s['cached']} from the cache), {s['wall_s']:.1f} s on "
              f"{s['workers']} workers; rate lattice step {s['rate_tolerance']:g}, {s['probe_requests']} "
              f"requests per probe.[/]")
    if not res["feasible"]:
        con.print("[red]no candidate meets the SLOs even at the lowest rate[/]")
        return
    con.print(f"placement: {res['prefill_instances']} x prefill {_par(res['prefill'])} + "
              f"{res['decode_instances']} x decode {_par(res['decode'])} = {res['gpus']} GPUs; "
              f"goodput {res['goodput_per_gpu']:.3g} req/s per GPU")
