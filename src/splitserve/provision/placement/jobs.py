"""The simulations of a placement search, one `Evaluator` job each: a prompt or token instance
behind full-node helpers (Alg. 1), a colocated pair (Alg. 2), the replicated placement, and the
vLLM baseline; and `goodput`, the highest lattice rate at which a job meets its goodput SLO.

Every job is a Splitwise-style split cluster of one catalog machine kind with no mixed pool
(DistServe's pools never lend machines), except the colocated baseline's unsplit instances. KV is
allocated on demand where the machine scheduler can (DistServe's instances and the vLLM baseline
run on vLLM: policy/schedulers vllm_allocation)."""

from __future__ import annotations

from ...policy.schedulers import vllm_allocation
from ..evaluate import Evaluator, Job
from ..search import max_rate
from .scenario import Scenario, context_of, full_node, split_designs

INF = float("inf")


def prefill_job(sc: Scenario, tp: int, pp: int, rps: float) -> Job:
    """One prompt instance (tp, pp) behind `helpers` full-node token instances; TTFT only."""
    htp, hpp = full_node(sc)
    return Job(split_designs(sc)[0], 1, sc.helpers, None, rps, sc.workload, sc.duration(rps), sc.seed,
               sc.model, sc.profile, (sc.ttft, INF), parallel=(None, None, tp, pp, htp, hpp),
               scheduler=sc.scheduler, kv_allocation=vllm_allocation(sc.scheduler), mixed_pool=False,
               max_context=context_of(sc), catalog=sc.catalog)


def decode_job(sc: Scenario, tp: int, pp: int, rps: float) -> Job:
    """One token instance (tp, pp) behind `helpers` full-node prompt instances; both SLOs."""
    htp, hpp = full_node(sc)
    return Job(split_designs(sc)[0], sc.helpers, 1, None, rps, sc.workload, sc.duration(rps), sc.seed,
               sc.model, sc.profile, (sc.ttft, sc.tpot), parallel=(None, None, htp, hpp, tp, pp),
               scheduler=sc.scheduler, kv_allocation=vllm_allocation(sc.scheduler), mixed_pool=False,
               max_context=context_of(sc), catalog=sc.catalog)


def pair_job(sc: Scenario, pp: int, tp_p: int, tp_d: int, rps: float, slo: tuple[float, float] | None = None,
             pairs: int = 1) -> Job:
    """`pairs` x (1 prompt + 1 token instance), stage segments colocated (KV over NVLink)."""
    return Job(split_designs(sc)[0], pairs, pairs, None, rps, sc.workload, sc.duration(rps), sc.seed,
               sc.model, sc.profile, slo or (sc.ttft, sc.tpot), parallel=(None, None, tp_p, pp, tp_d, pp),
               scheduler=sc.scheduler, kv_allocation=vllm_allocation(sc.scheduler), mixed_pool=False,
               colocated=True, max_context=context_of(sc), catalog=sc.catalog)


def split_job(sc: Scenario, prefill: tuple[int, int], decode: tuple[int, int], n: int, m: int, rps: float,
              slo: tuple[float, float] | None = None) -> Job:
    """The replicated Alg. 1 placement: n prompt and m token instances, KV over the network."""
    return Job(split_designs(sc)[0], n, m, None, rps, sc.workload, sc.duration(rps), sc.seed,
               sc.model, sc.profile, slo or (sc.ttft, sc.tpot), parallel=(None, None, *prefill, *decode),
               scheduler=sc.scheduler, kv_allocation=vllm_allocation(sc.scheduler), mixed_pool=False,
               max_context=context_of(sc), catalog=sc.catalog)


def colocated_job(sc: Scenario, tp: int, rps: float, slo: tuple[float, float] | None = None,
                  machines: int = 1, scheduler: str | None = None) -> Job:
    """The vLLM baseline: `machines` unsplit instances of tp GPUs (pp 1) batching both phases."""
    return Job(split_designs(sc)[1], None, None, machines, rps, sc.workload, sc.duration(rps), sc.seed,
               sc.model, sc.profile, slo or (sc.ttft, sc.tpot), parallel=(tp, 1, None, None, None, None),
               scheduler=scheduler, kv_allocation=vllm_allocation(scheduler), mixed_pool=True,
               max_context=context_of(sc), catalog=sc.catalog)


# ---- goodput -------------------------------------------------------------------------------
def goodput(ev: Evaluator, sc: Scenario, make) -> float:
    """Max lattice rate at which `make(rate)`'s simulation meets its goodput SLO (0.0: not even
    the lowest rate)."""
    def test(rates: list[float]) -> list[bool]:
        return [o.slo_met for o in ev([make(r) for r in rates])]

    r = max_rate(test, sc.lattice, sc.lo_rps, sc.hi_rps, width=ev.width)
    return r or 0.0
