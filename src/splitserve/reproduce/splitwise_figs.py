"""Figs. 14-15, 17 and 20 of the Splitwise evaluation, run on the simulator: the KV transfer's
visible time against prompt size (serialized, layer-wise) and what it adds to a request's
latency, the share of busy time each pool spends at each number of batched tokens, and clusters
provisioned for one workload or model run with another. Each function returns plain data;
splitwise_figs_report.py writes the sections.

The simulator's trace hooks (`SimConfig.trace`, sim/chrome_trace.py) are what these read:
`Recorder` keeps their totals instead of the events."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from ..catalog import load_model
from ..cluster.designs import make_cluster
from ..policy.config import PolicyConfig
from ..provision import plan
from ..sim.chrome_trace import ChromeTrace
from ..sim.run import run_simulation
from ..sim.config import SimConfig
from ..sim.simulator import Simulation
from ..workload import RequestSpec, make_workload
from . import experiments as ex


class Recorder(ChromeTrace):
    """The trace hooks as totals: each home pool's busy seconds by the batched tokens (prompt
    tokens + decodes) of an iteration, and each request's KV transfer (start, landed, layer-wise)."""

    def __init__(self) -> None:
        super().__init__(max_events=1)
        self.pool: dict[int, str] = {}
        self.busy: dict[str, dict[int, float]] = {}
        self.transfers: dict[int, tuple[float, float, bool]] = {}

    def name_machines(self, machines) -> None:
        self.pool = {m.id: m.home.name.lower() for m in machines}

    def batch(self, machine, start, dur, prompt_tokens, decodes, context, preempted) -> None:
        d = self.busy.setdefault(self.pool[machine], {})
        n = prompt_tokens + decodes
        d[n] = d.get(n, 0.0) + dur

    def transfer(self, src, dst, request, start, end, nbytes, layerwise) -> None:
        self.transfers[request] = (start, end, layerwise)


# ---- Figs. 14-15: one request at a time on 1 prompt + 1 token machine ---------------------------
MACHINES = {"a100": ("splitwise-aa", "baseline-a100"), "h100": ("splitwise-hh", "baseline-h100")}
MODES = {"serialized": 1 << 40, "layer-wise": 0, "splitwise": None}   # layer-wise threshold (None: default)
FIG14_PROMPTS = {"llama2-70b": (128, 256, 512, 1024, 1500, 2048, 4000),
                 "bloom-176b": (128, 256, 512, 1024, 2048, 4096, 8000)}
GAP = 600.0          # seconds between arrivals: each request runs alone


def _alone(design: str, model: str, sizes: list[tuple[int, int]], profile: str | None,
           threshold: int | None = None) -> list[dict]:
    """Each (prompt, output) request alone on one machine (a baseline design) or on 1P + 1T."""
    split = design.startswith("splitwise")
    cluster = (make_cluster(design, prompt_machines=1, token_machines=1) if split
               else make_cluster(design, machines=1))
    policy = PolicyConfig() if threshold is None else PolicyConfig(layerwise_threshold=threshold)
    rec = Recorder()
    specs = [RequestSpec(i * GAP, p, o) for i, (p, o) in enumerate(sizes)]
    res = Simulation(cluster, load_model(model), specs,
                     SimConfig(policy=policy, record_requests=True, profile=profile, trace=rec)).run()
    out = []
    for r in sorted(res.requests, key=lambda r: r.id):
        t = r.token_times
        assert t is not None, "recorded with record_requests"
        row = {"prompt": r.prompt_tokens, "output": r.output_tokens, "ttft": t[0] - r.arrival,
               "e2e": t[-1] - r.arrival, "second": t[1] - t[0] if len(t) > 1 else None}
        if r.id in rec.transfers:
            start, end, lw = rec.transfers[r.id]
            row.update(visible=end - t[0], layerwise=lw)
        out.append(row)
    return out


def transfer_by_prompt(runner: ex.Runner) -> dict:
    """Fig. 14: the visible (non-overlapped) KV transfer time of one prompt, serialized and
    layer-wise, against its size, and against its prompt computation time."""
    out: dict = {}
    for model, prompts in FIG14_PROMPTS.items():
        sizes = [(p, 2) for p in prompts]
        for hw, (design, _) in MACHINES.items():
            for mode in ("serialized", "layer-wise"):
                rows = _alone(design, model, sizes, runner.profile, MODES[mode])
                out.setdefault(model, {}).setdefault(hw, {})[mode] = [
                    {"prompt": r["prompt"], "prompt_ms": r["ttft"] * 1e3, "visible_ms": r["visible"] * 1e3,
                     "overhead": r["visible"] / r["ttft"]} for r in rows]
    return out


def transfer_on_trace(runner: ex.Runner, requests: int) -> dict:
    """Fig. 15: `requests` of the coding trace, each alone (no batching), on a 1-machine baseline
    and on 1P + 1T with serialized, layer-wise and Splitwise's choice (layer-wise from 512
    batched prompt tokens) of transfer: each request's TTFT, second-token and E2E time against
    the baseline's."""
    model = load_model(ex.MODEL)
    wl = make_workload("coding", rps=1.0, duration=10 * requests, seed=runner.seed, max_context=model.max_context)
    sizes = [(r.prompt_tokens, r.output_tokens) for r in wl][:requests]
    out: dict = {}
    for hw, (split, base) in MACHINES.items():
        ref = _alone(base, ex.MODEL, sizes, runner.profile)
        out[hw] = {"requests": len(sizes)}
        for mode, threshold in MODES.items():
            rows = _alone(split, ex.MODEL, sizes, runner.profile, threshold)
            over = {k: [(r[k] - b[k]) / b[k] for r, b in zip(rows, ref) if b[k]] for k in ("ttft", "second", "e2e")}
            big = [(r["e2e"] - b["e2e"]) / b["e2e"] for r, b in zip(rows, ref) if r["prompt"] >= 1500]
            out[hw][mode] = {"ttft_mean": float(np.mean(over["ttft"])),
                             "second_mean": float(np.mean(over["second"])),
                             "e2e_mean": float(np.mean(over["e2e"])), "e2e_max": float(np.max(over["e2e"])),
                             "e2e_mean_large": float(np.mean(big)) if big else None, "large": len(big),
                             "layerwise_share": float(np.mean([r.get("layerwise", False) for r in rows]))}
    return out


# ---- Fig. 17: busy time by batched tokens ------------------------------------------------------
FIG17_CLUSTERS = {"baseline-h100": [40], "splitwise-hh": [25, 15]}    # iso-power, conversation (Fig. 16b)
FIG17_LOADS = (70.0, 130.0)


def _busy(job: dict) -> dict:
    rec = Recorder()
    run_simulation(trace=rec, **job)
    return rec.busy


def _cdf(busy: dict[int, float], points: int = 60) -> dict:
    tokens = np.array(sorted(busy))
    cum = np.cumsum([busy[t] for t in tokens])
    total = float(cum[-1])
    at = lambda x: float(cum[np.searchsorted(tokens, x, side="right") - 1] / total) if x >= tokens[0] else 0.0
    grid = sorted({int(round(x)) for x in np.geomspace(1, max(2, tokens[-1]), points)})
    median = int(tokens[np.searchsorted(cum, 0.5 * total)])
    return {"busy_s": total, "cdf": [[x, at(x)] for x in grid], "le15": at(15), "median": median,
            "p90": int(tokens[min(len(tokens) - 1, int(np.searchsorted(cum, 0.9 * total)))])}


def batched_tokens(runner: ex.Runner, scale: ex.Scale) -> dict:
    """Fig. 17: for each cluster and load of conversation, each pool's time-weighted CDF of the
    tokens batched per iteration (busy time only)."""
    keys = [(d, rps) for d in FIG17_CLUSTERS for rps in FIG17_LOADS]
    jobs = [{"model": ex.MODEL, "seed": runner.seed, "profile": runner.profile, "workload": "conversation",
             "rps": rps, "duration": scale.duration, **ex.counts(d, FIG17_CLUSTERS[d])} for d, rps in keys]
    runner.simulations += len(jobs)
    if runner.workers > 1:
        with ProcessPoolExecutor(min(runner.workers, len(jobs))) as pool:
            busy = list(pool.map(_busy, jobs))
    else:
        busy = [_busy(j) for j in jobs]
    out: dict = {}
    for (d, rps), b in zip(keys, busy):
        out.setdefault(d, {})[f"{rps:g}"] = {pool: _cdf(v) for pool, v in sorted(b.items())}
    return out


# ---- Fig. 20: a cluster provisioned for one workload / model, run with another -------------------
def _counts(r: dict) -> tuple[int, ...]:
    return (r["prompt_machines"], r["token_machines"]) if "prompt_machines" in r else (r["machines"],)


def _rates(scale: ex.Scale) -> plan.RateRange:
    return plan.RateRange(1.0, 1000.0, plan.RateLattice(scale.rate_tolerance))


def _throughputs(runner: ex.Runner, scale: ex.Scale, clusters: dict, sc: plan.Scenario) -> dict:
    """Each feasible cluster's throughput at SLO on `sc`, and the SLO it misses first one rate
    step above it (the evaluator's memo answers that simulation when the search ran it)."""
    ev, rates = runner.evaluator(), _rates(scale)
    out: dict[str, dict[str, Any]] = {}
    for d, r in clusters.items():
        if not r.get("feasible"):
            out[d] = {"rps": None}
            continue
        rps = plan.throughput_at_slo(ev, plan.design(d), _counts(r), sc, rates)
        nxt = rates.lattice.rate(rates.lattice.index(rps if rps else rates.lo) + (1 if rps else 0))
        (o,) = ev([sc.job(d, _counts(r), nxt)])
        out[d] = {"rps": rps, "binding": o.worst, "binding_at": nxt, "binding_ratio": o.violation}
    return out


def at_split(runner: ex.Runner, scale: ex.Scale, design: str, split: list[int], workload: str) -> float | None:
    """Throughput at SLO of one given split (the paper's own, as a counterfactual)."""
    sc = plan.Scenario(workload, scale.search_duration, runner.seed, ex.MODEL, runner.profile)
    return plan.throughput_at_slo(runner.evaluator(), plan.design(design), tuple(split), sc, _rates(scale))


def robustness(runner: ex.Runner, scale: ex.Scale, conversation: dict) -> dict:
    """Fig. 20a: each design's iso-power cluster provisioned for coding, run with conversation,
    beside its cluster provisioned for conversation (`conversation`: Fig. 18a's). Fig. 20b: each
    design's cluster provisioned for BLOOM-176B (conversation), run with Llama2-70B."""
    coding = ex.throughput_optimised(runner, scale, "coding", "iso-power")
    conv = plan.Scenario("conversation", scale.search_duration, runner.seed, ex.MODEL, runner.profile)
    on_coding = _throughputs(runner, scale, coding, conv)
    workload = {d: {"coding_split": _counts(coding[d]) if coding[d].get("feasible") else None,
                    "conversation_split": _counts(r) if r.get("feasible") else None,
                    "conversation_on_coding": on_coding[d]["rps"], "binding": on_coding[d].get("binding"),
                    "binding_at": on_coding[d].get("binding_at"),
                    "conversation_on_conversation": r.get("throughput_at_slo")} for d, r in conversation.items()}
    loads = [x * scale.budget_machines / ex.POWER_BUDGET_MACHINES for x in scale.loads]
    bloom_sc = plan.Scenario("conversation", scale.search_duration, runner.seed, "bloom-176b", runner.profile)
    ev = runner.evaluator()
    budget = plan.budget_value(f"{scale.budget_machines}*dgx-h100", "iso-power")
    bloom = {d: plan.best_within_budget(ev, plan.design(d), "iso-power", budget, bloom_sc, plan.Limits(),
                                        _rates(scale), stride=scale.stride) for d in ex.DESIGNS}
    llama = _throughputs(runner, scale, bloom, conv)
    sweep: dict[str, list[dict]] = {d: [] for d, r in bloom.items() if r.get("feasible")}
    for d in sweep:
        outs = ev([conv.job(d, _counts(bloom[d]), rps) for rps in loads])
        sweep[d] = [{"rps": rps, "slo_met": o.slo_met, **o.slowdowns} for rps, o in zip(loads, outs)]
    model = {d: {"split": _counts(r) if r.get("feasible") else None, "bloom": r.get("throughput_at_slo"),
                 "llama": llama[d]["rps"]} for d, r in bloom.items()}
    return {"workload": workload, "model": model, "llama_on_bloom_sweep": sweep}
