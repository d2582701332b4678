"""DistServe's experiments: the scales, Table 1's rows, and one experiment
per row: Alg. 2's placement and Alg. 1's for the ablation (provision/placement/), vLLM and vLLM++
goodputs, attainment against per-GPU rate and against SLO scale, and the gains over vLLM.
Every simulation allocates KV on demand, as vLLM and DistServe do (provision/placement/'s jobs)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import Any
from importlib import resources

from ..provision import placement as pl
from ..provision.evaluate import Evaluator
from ..provision.search import RateLattice, first_true

INF = float("inf")


def paper() -> dict:
    return tomllib.loads(resources.files("splitserve.reproduce").joinpath("distserve_paper.toml").read_text())


@dataclass(frozen=True)
class Experiment:
    key: str           # "chatbot-opt-13b": Table 1's row
    app: str           # chatbot, code, summarization
    model: str
    workload: str
    figure: str


EXPERIMENTS = (
    Experiment("chatbot-opt-13b", "chatbot", "opt-13b", "sharegpt", "Figure 8(a)"),
    Experiment("chatbot-opt-66b", "chatbot", "opt-66b", "sharegpt", "Figure 8(b)"),
    Experiment("chatbot-opt-175b", "chatbot", "opt-175b", "sharegpt", "Figure 8(c)"),
    Experiment("code-opt-66b", "code", "opt-66b", "humaneval", "Figure 9(a)"),
    Experiment("summarization-opt-66b", "summarization", "opt-66b", "longbench", "Figure 9(b)"),
)


@dataclass(frozen=True)
class Scale:
    name: str
    experiments: tuple[str, ...]
    requests: int                  # requests per simulated rate
    tolerance: float               # rate lattice step
    tps: tuple[int, ...]
    max_pp: int
    nodes: int
    curve: tuple[float, ...]       # per-GPU rates, as multiples of DistServe's goodput per GPU
    slo_scales: tuple[float, ...]  # SLO scales for the attainment-vs-scale curves
    high_affinity: tuple[str, ...] = ()   # experiments that also run Alg. 1 (Figure 11)


TINY = Scale("tiny", ("chatbot-opt-13b",), 80, 0.25, (1, 2), 1, 1, (0.5, 1.0, 1.5), (0.5, 1.0, 2.0),
             ("chatbot-opt-13b",))
QUICK = Scale("quick", ("chatbot-opt-13b", "chatbot-opt-66b", "chatbot-opt-175b", "code-opt-66b",
                        "summarization-opt-66b"),
              250, 0.08, (1, 2, 4, 8), 2, 2, (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0),
              (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0), ("chatbot-opt-13b",))
FULL = Scale("full", tuple(e.key for e in EXPERIMENTS), 800, 0.03, (1, 2, 4, 8), 4, 4,
             (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5), (0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0),
             ("chatbot-opt-13b",))
SCALES = {s.name: s for s in (TINY, QUICK, FULL)}
SCALE_LATTICE = RateLattice(0.05)        # SLO scales searched: 1.05^k
PLACEMENT_RPS = 10.0                     # the rate the placements are replicated to (counts only)


def _scenario(exp: Experiment, scale: Scale, pub: dict, seed: int) -> pl.Scenario:
    slo = pub["slo"][exp.key]
    return pl.Scenario(exp.model, exp.workload, slo["ttft"], slo["tpot"], requests=scale.requests,
                       seed=seed, nodes=scale.nodes, tps=scale.tps, max_pp=scale.max_pp,
                       lattice=RateLattice(scale.tolerance), lo_rps=0.02, hi_rps=256.0)


def _attain(ev: Evaluator, jobs: list) -> list[float]:
    return [o.attainment if o.attainment is not None else 0.0 for o in ev(jobs)]


def min_slo_scale(ev: Evaluator, make) -> float | None:
    """The least lattice SLO scale in [0.05, 50] whose attainment is >= 90% (make(scale) -> job)."""
    a, b = SCALE_LATTICE.index(0.05), SCALE_LATTICE.index(50.0)
    k = first_true(a, b, lambda ks: [o.slo_met for o in ev([make(SCALE_LATTICE.rate(k)) for k in ks])],
                   ev.width)
    return None if k is None else SCALE_LATTICE.rate(k)


def run_experiment(ev: Evaluator, exp: Experiment, scale: Scale, pub: dict, seed: int) -> dict:
    sc = _scenario(exp, scale, pub, seed)
    ttft, tpot = sc.ttft, sc.tpot
    low = pl.low_affinity(ev, sc, PLACEMENT_RPS)
    vtp = pub["setup"]["vllm_intra_op"][exp.model]
    vllm_g = pl.goodput(ev, sc, lambda r: pl.colocated_job(sc, vtp, r, scheduler="vllm"))
    vpp = pl.vllm_plus_plus(ev, sc, scheduler="vllm")
    res: dict[str, Any] = {"experiment": exp.key, "model": exp.model, "workload": exp.workload, "figure": exp.figure,
           "slo": {"ttft_s": ttft, "tpot_s": tpot}, "low_affinity": low,
           "vllm": {"tp": vtp, "goodput": vllm_g, "per_gpu": vllm_g / vtp}, "vllm_pp": vpp}
    if exp.key in scale.high_affinity:
        high = pl.high_affinity(ev, sc, PLACEMENT_RPS)
        if high["feasible"]:   # phase-level goodput per GPU, no rounding of replica counts
            p, d = high["prefill"], high["decode"]
            high["phase_per_gpu"] = 1.0 / (p["gpus"] / p["goodput"] + d["gpus"] / d["goodput"])
        res["high_affinity"] = high
    pair = low["pair"]
    if pair is None:
        return res
    pp, a, b, gpus = pair["pp"], pair["tp_p"], pair["tp_d"], pair["gpus"]
    dist = pair["per_gpu"]
    vbest = vpp["best"]
    vpp_tp = vbest["tp"] if vbest else vtp

    def dist_job(x, slo):
        return pl.pair_job(sc, pp, a, b, x * gpus, slo)

    def vllm_job(tp, x, slo):
        return pl.colocated_job(sc, tp, x * tp, slo, scheduler="vllm")

    # attainment against per-GPU rate (Figures 8/9, row 1)
    xs = [round(f * dist, 6) for f in scale.curve]
    curves = {
        "DistServe": _attain(ev, [dist_job(x, (ttft, tpot)) for x in xs]),
        "DistServe TTFT only": _attain(ev, [dist_job(x, (ttft, INF)) for x in xs]),
        "DistServe TPOT only": _attain(ev, [dist_job(x, (INF, tpot)) for x in xs]),
        f"vLLM (tp {vtp})": _attain(ev, [vllm_job(vtp, x, (ttft, tpot)) for x in xs]),
    }
    if vpp_tp != vtp:
        curves[f"vLLM++ (tp {vpp_tp})"] = _attain(ev, [vllm_job(vpp_tp, x, (ttft, tpot)) for x in xs])
    res["rate_curve"] = {"per_gpu_rps": xs, "attainment": curves}
    # attainment against SLO scale at a fixed per-GPU rate (Figures 8/9, row 2)
    x0 = res["vllm"]["per_gpu"] or dist / 2
    res["slo_rate_per_gpu"] = x0
    ss = list(scale.slo_scales)
    res["scale_curve"] = {"scales": ss, "attainment": {
        "DistServe": _attain(ev, [dist_job(x0, (s * ttft, s * tpot)) for s in ss]),
        f"vLLM (tp {vtp})": _attain(ev, [vllm_job(vtp, x0, (s * ttft, s * tpot)) for s in ss])}}
    res["min_scale"] = {
        "DistServe": min_slo_scale(ev, lambda s: dist_job(x0, (s * ttft, s * tpot))),
        "vLLM": min_slo_scale(ev, lambda s: vllm_job(vtp, x0, (s * ttft, s * tpot)))}
    v = res["vllm"]["per_gpu"]
    res["rate_gain"] = dist / v if v else None
    ms = res["min_scale"]
    res["slo_gain"] = ms["vLLM"] / ms["DistServe"] if ms["vLLM"] and ms["DistServe"] else None
    return res
