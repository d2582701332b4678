"""`summary.json`: the one result format of every run, simulated or live (docs/architecture.md, "summary.json")."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .goodput import attainment_summary
from .slo import SLO, evaluate


def finite_or_none(x):
    """`x` with every float that is not finite (inf, nan) as None, through dicts and lists: what JSON holds."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite_or_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [finite_or_none(v) for v in x]
    return x


def simulation_summary(result, workload, slo: SLO = SLO(), goodput=None) -> dict:
    """Summary of a `sim.simulator.SimResult` for the workload that drove it; `goodput` (a
    report.goodput.GoodputSLO): DistServe's SLO attainment too."""
    mt = result.metrics
    span = mt.last_completion - min(mt.first_arrival, mt.last_completion) if mt.completed else 0.0
    machines, cost, power, energy = machine_groups(result)
    hours = result.sim_end / 3600.0
    out = finite_or_none({
        "design": result.cluster.design.name,
        "cluster_label": result.cluster.label(),
        "model": result.model,
        "workload": {"name": workload.name, "rps": workload.rps, "duration_s": workload.duration},
        "requests": mt.requests,
        "completed": mt.completed,
        "failed": mt.failed,
        "throughput_rps": mt.completed / span if span > 0 else 0.0,
        "offered_rps": (mt.requests - 1) / (mt.last_arrival - mt.first_arrival)
        if mt.requests > 1 and mt.last_arrival > mt.first_arrival else None,
        "tokens_generated": mt.tokens,
        "ttft_s": mt.ttft.summary(),
        "tbt_s": mt.tbt.summary(),
        "e2e_s": mt.e2e.summary(),
        "queue_s": mt.queue.summary(),
        "slo": evaluate(slo, mt.slow_ttft, mt.slow_tbt, mt.slow_e2e),
        "cluster": {
            "design": result.cluster.design.name,
            "machines": machines,
            "machine_count": result.cluster.machines,
            "gpus": result.cluster.gpus,
            "cost_per_hour": cost,
            "power_kw": power,
            "energy_kwh": energy / 3.6e6,
            "cost_per_1k_requests": cost * hours / mt.completed * 1000 if mt.completed else None,
            "borrowed_into_mixed_pool": result.borrowed,
            "preemptions": mt.preemptions,
            "recomputed_tokens": mt.recomputed_tokens,
        },
        "kv_transfer": {
            "transfers": mt.transfers,
            "layerwise": mt.transfer_layerwise,
            "bytes": mt.transfer_bytes,
            "visible_s": mt.transfer_visible.summary(),
        },
        "sim": {
            "wall_s": result.wall_s,
            "events": result.events,
            "events_per_s": result.events / result.wall_s if result.wall_s > 0 else None,
            "simulated_s": result.sim_end,
            "perf_model": result.perf_sources,
        },
    })
    if mt.prefix_queries:
        out["prefix_cache"] = prefix_summary(mt.prefix_queries, mt.prefix_hits)
    if mt.transfer_skipped:
        out["kv_transfer"]["skipped_tokens"] = mt.transfer_skipped
    if goodput is not None:
        out["goodput"] = finite_or_none(attainment_summary(goodput, mt.attained, mt.completed, mt.requests))
    if result.scaling is not None:
        out["scaling"] = finite_or_none(scaling_summary(result, mt))
    return out


def machine_groups(result) -> tuple[list[dict], float, float, float]:
    """A SimResult's machines grouped by pool and hardware (count, mean utilization, peak KV
    fraction), and the cluster's cost per hour, power in kW and energy in joules."""
    from ..catalog import load_hardware

    machines: dict[str, dict] = {}
    cost = power = energy = 0.0
    for st in result.metrics.machines:
        hw = result.hardware.get(st.hardware) or load_hardware(st.hardware)
        key = f"{st.pool}:{st.hardware}"
        g = machines.setdefault(key, {"pool": st.pool, "hardware": st.hardware, "count": 0,
                                      "utilization": 0.0, "peak_kv_fraction": 0.0})
        g["count"] += 1
        g["utilization"] += st.busy_s / result.sim_end if result.sim_end > 0 else 0.0
        g["peak_kv_fraction"] = max(g["peak_kv_fraction"], st.peak_kv_used / st.kv_capacity)
        cost += hw.cost_per_hour
        power += hw.power_kw
        energy += st.energy_j
    for g in machines.values():
        g["utilization"] /= g["count"]
    return list(machines.values()), cost, power, energy


def prefix_summary(queries: int, hits: int) -> dict:
    """summary.json's `prefix_cache` (a run whose prompts share prefixes), in tokens as vLLM's
    vllm:prefix_cache_queries / vllm:prefix_cache_hits count them: prompt tokens looked up, those
    found cached (their prefill saved), and the ratio."""
    return {"queries": queries, "hits": hits, "hit_rate": hits / queries if queries else None,
            "tokens_saved": hits}


def scaling_summary(result, mt) -> dict:
    """What a scaling scheduler kept on (policy/aladdin_scaling.py `activity`): machine-seconds, GPU-hours and
    cost while on, beside the whole cluster's for the same span."""
    from ..catalog import load_hardware

    act = result.scaling
    on_s = gpu_h = cost = 0.0
    for mid, s in act["machine_seconds"].items():
        name = mt.machines[mid].hardware
        hw = result.hardware.get(name) or load_hardware(name)
        gpus = hw.instance.gpus if hasattr(hw, "instance") else hw.gpus
        on_s += s
        gpu_h += gpus * s / 3600.0
        cost += hw.cost_per_hour * s / 3600.0
    span = result.sim_end * len(mt.machines)
    return {"machine_seconds_active": on_s, "active_fraction": on_s / span if span > 0 else None,
            "gpu_hours_active": gpu_h, "cost_active": cost,
            "cost_per_1k_requests_active": cost / mt.completed * 1000 if mt.completed else None,
            "scale_ups": act["scale_ups"], "scale_downs": act["scale_downs"],
            "bins_opened": act["bins_opened"], "corrections": act["corrections"]}


def write_summary(summary: dict, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path
