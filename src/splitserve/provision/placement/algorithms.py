"""DistServe's two placement algorithms and the vLLM++ baseline, each over
the candidates of scenario.py, every goodput a search of jobs.py.

- Alg. 1, high node-affinity (`high_affinity`, §4.1): KV moves over the machines' network (the
  catalog's `ib_gbs`), so the phases are searched apart. For each parallelism (tp GPUs of one node
  x pp stages, tp * pp <= nodes * GPUs per node, the weights must fit: catalog.kv_capacity_tokens)
  `simu_prefill` is the max rate of ONE prompt instance of it with `helpers` full-node token
  instances (decode never limits) at >= 90% TTFT attainment (TPOT SLO infinite); `simu_decode` is
  the max rate of ONE token instance with `helpers` full-node prompt instances at >= 90% attainment
  of both SLOs. Both SLOs there because in this simulator a request waits for room in its token
  machine's KV before its prompt runs (policy.cluster.admit), so a saturated decoder shows as TTFT,
  where DistServe's decoder queues after the first token (a known difference). The best goodput
  per GPU of each phase is replicated: n = ceil(R / prefill goodput), m = ceil(R / decode goodput).
- Alg. 2, low node-affinity (`low_affinity`, §4.2): prefill and decoding segments of one pipeline
  stage share a node, so KV moves over NVLink (`Job.colocated`, sim/kv_transfer.link_between). For
  each pp in 1..nodes and each (tp_p, tp_d) with tp_p + tp_d <= GPUs per node, both fitting with
  pp stages, the max rate of the pair (1 prompt + 1 token instance) meeting both SLOs; the best
  per GPU is replicated: n = ceil(R / pair goodput) pairs.

Results are plain dicts (JSON-ready), with the goodput of every candidate and the simulations run.
"""

from __future__ import annotations

import math

from ..evaluate import Evaluator
from .jobs import colocated_job, decode_job, goodput, pair_job, prefill_job
from .scenario import Scenario, fits, pair_candidates, phase_candidates, tensor_degrees


def _best(rows: list[dict]) -> dict | None:
    """Highest goodput per GPU; ties to fewer GPUs, then smaller tp, then fewer stages."""
    ok = [r for r in rows if r["goodput"] > 0]
    return min(ok, key=lambda r: (-r["per_gpu"], r["gpus"], r.get("tp", 0), r.get("pp", 0),
                                  r.get("tp_p", 0), r.get("tp_d", 0))) if ok else None


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
