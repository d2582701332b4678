"""`splitserve reproduce distserve --out DIR`: DistServe's end-to-end evaluation (seed 002, paper 0,
§6.2 Figures 8 and 9, §6.4 Figure 11) on splitserve's simulator: SLO attainment against per-GPU
rate and against SLO scale for DistServe (the placement `provision/placement.py` finds, FCFS, no
mixed pool) and vLLM (one colocated instance of the paper's intra-op degree, the `vllm` machine
scheduler) and vLLM++ (the same at its best tensor degree); goodput gains beside the paper's
(reproduce/distserve_paper.toml). Writes DIR/report.md, one PNG per experiment, results.json.

Goodput per GPU is the highest rate on the rate lattice at which >= 90% of requests meet both
SLOs, divided by the GPUs of the unit simulated: one prefill + decode pair for DistServe-Low
(replicas of it carry proportionally more), one instance for vLLM. The SLO-scale gain is the
least SLO scale (both SLOs times s) meeting 90% for vLLM over DistServe's, both at one per-GPU
rate: vLLM's goodput per GPU (the paper does not say which rate it fixed; ASSUMED). Attainment is
monotone in the SLO scale by construction (the same simulation judged against looser limits).
"""

from __future__ import annotations

import json
import time
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..provision import placement as pl
from ..provision.evaluate import Cache, Evaluator, LocalBackend
from ..provision.search import RateLattice, first_true
from .markdown import Report
from .plots import plt

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
    res = {"experiment": exp.key, "model": exp.model, "workload": exp.workload, "figure": exp.figure,
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


# ---- plots ---------------------------------------------------------------------------------
def plot(res: dict, path: Path) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2), constrained_layout=True)
    rc = res["rate_curve"]
    styles = {"DistServe": "-", "DistServe TTFT only": ":", "DistServe TPOT only": "--"}
    for name, ys in rc["attainment"].items():
        ax1.plot(rc["per_gpu_rps"], [100 * y for y in ys], marker="o", markersize=3,
                 linestyle=styles.get(name, "-"), label=name)
    ax1.axhline(90, color="grey", linewidth=0.8)
    for name, x in (("DistServe", res["low_affinity"]["pair"]["per_gpu"]), ("vLLM", res["vllm"]["per_gpu"])):
        if x:
            ax1.axvline(x, color="C0" if name == "DistServe" else "C3", linewidth=0.8, linestyle="-.")
    ax1.set_xlabel("rate per GPU (req/s)")
    ax1.set_ylabel("SLO attainment (%)")
    ax1.set_ylim(0, 102)
    ax1.legend(fontsize=7)
    ax1.set_title("attainment against per-GPU rate (vertical: goodput at 90%)", fontsize=9)
    sc = res["scale_curve"]
    for name, ys in sc["attainment"].items():
        ax2.plot(sc["scales"], [100 * y for y in ys], marker="o", markersize=3, label=name)
    ax2.axhline(90, color="grey", linewidth=0.8)
    ax2.set_xscale("log")
    ax2.set_xlabel("SLO scale (both SLOs of Table 1 times s)")
    ax2.set_ylim(0, 102)
    ax2.legend(fontsize=7)
    ax2.set_title(f"attainment against SLO scale at {res['slo_rate_per_gpu']:.3g} req/s per GPU", fontsize=9)
    fig.suptitle(f"{res['figure']}: {res['model'].upper()}, {res['workload']} "
                 f"(TTFT {res['slo']['ttft_s']:g} s, TPOT {res['slo']['tpot_s']:g} s)")
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- the report ----------------------------------------------------------------------------
def _f(x, fmt=".3g") -> str:
    return "-" if x is None else format(x, fmt)


def _paper_gain(pub: dict, app: str, kind: str):
    return pub["gains"][f"{app}_{kind}"]


def _paper_str(v) -> str:
    return f"{v[0]:g}-{v[1]:g}" if isinstance(v, list) else f"{v:g}"


def _explain(rep: Report, what: str, ours, theirs, why: str) -> None:
    if ours is None:
        return
    if isinstance(theirs, list):      # a range: compare with its nearer end
        if theirs[0] <= ours <= theirs[1]:
            return
        theirs = theirs[0] if ours < theirs[0] else theirs[1]
    rep.explain(what, ours, theirs, why)


def write_report(out: Path, results: list[dict], scale: Scale, pub: dict, seed: int, wall_s: float,
                 search: dict) -> Path:
    rep = Report(out)
    rep.add("# DistServe, reproduced on splitserve's simulator", "",
            f"Generated by `splitserve reproduce distserve --scale {scale.name}` ({scale.requests} requests per "
            f"simulated rate, rate lattice step {scale.tolerance:.0%}, tensor degrees {list(scale.tps)}, up to "
            f"{scale.max_pp} pipeline stages, seed {seed}; {search['simulated']} simulations, "
            f"{search['cached']} from the cache, {wall_s:.0f} s on {search['workers']} workers). "
            "The paper: Zhong et al., \"DistServe: Disaggregating Prefill and Decoding for Goodput-optimized "
            "Large Language Model Serving\", OSDI 2024 (seed 002, paper 0); its figures are in "
            "`src/splitserve/reproduce/distserve_paper.toml` with their sections. Each ratio is ours divided by "
            "the paper's.", "",
            "## Setup", "",
            "- Hardware: DGX-A100 nodes of 8 A100-80GB with NVLink (§6.1) from `catalog/hardware.toml`, "
            "roofline performance model (perf/roofline.py), not DistServe's profiled latency model.",
            "- DistServe: Alg. 2 (low node-affinity, §4.2), as the paper's end-to-end runs: the best pair of "
            "a prefill and a decode instance of pp stages whose stage segments share a node (tp_p + tp_d <= 8), "
            "KV over NVLink; FCFS; no mixed pool (provision/placement.py).",
            "- vLLM: one colocated instance with the paper's intra-op degree (1, 4, 8 for OPT-13B/66B/175B, §6.1), "
            "the `vllm` machine scheduler (policy/schedulers/vllm.py: prefill-first). vLLM++: the same at its "
            "best tensor degree among those searched (§6.4), pp 1 (vLLM has no inter-op parallelism).",
            "- Workloads: synthetic sizes (scripts/distserve_workloads.py): ShareGPT means from seed 003 Table 2; "
            "HumanEval lengths and LongBench output lengths ASSUMED (the paper's Figure 7 is an image); "
            "prompt + output clipped to OPT's 2,048-token context; Poisson arrivals (§6.1).",
            "- SLOs: Table 1; attainment target 90% (§6.1).", "")
    rep.add("## Goodput per GPU and gains over vLLM (Figures 8 and 9)", "")
    rows = []
    for r in results:
        exp = next(e for e in EXPERIMENTS if e.key == r["experiment"])
        pair = r["low_affinity"]["pair"]
        vb = r["vllm_pp"]["best"]
        pr, ps = _paper_gain(pub, exp.app, "rate"), _paper_gain(pub, exp.app, "slo")
        rows.append([f"{exp.model.upper()} {exp.app} ({exp.figure})",
                     f"{r['slo']['ttft_s']:g} / {r['slo']['tpot_s']:g}",
                     "-" if pair is None else f"pp{pair['pp']}: P tp{pair['tp_p']} + D tp{pair['tp_d']}",
                     _f(pair["per_gpu"] if pair else None), _f(r["vllm"]["per_gpu"]),
                     "-" if vb is None else f"{vb['per_gpu']:.3g} (tp {vb['tp']})",
                     _f(r.get("rate_gain"), ".2f"), _paper_str(pr),
                     _f(r.get("min_scale", {}).get("DistServe")), _f(r.get("min_scale", {}).get("vLLM")),
                     _f(r.get("slo_gain"), ".2f"), _paper_str(ps)])
    rep.table(["experiment", "TTFT / TPOT SLO (s)", "DistServe pair", "DistServe req/s/GPU", "vLLM req/s/GPU",
               "vLLM++ req/s/GPU", "rate gain", "paper", "least SLO scale DistServe", "vLLM",
               "SLO gain", "paper"], rows)
    why_rate = ("the simulator's roofline latencies and synthetic workload sizes set where each phase "
                "saturates; a decode instance here reserves each request's whole prompt + output KV when "
                "admitted (policy/transitions.py), so small decode instances hold fewer requests than "
                "DistServe's paged, grow-as-you-go KV, and the vLLM scheduler here is prefill-first with the "
                "same reservation")
    for r in results:
        exp = next(e for e in EXPERIMENTS if e.key == r["experiment"])
        _explain(rep, f"{exp.key} rate gain", r.get("rate_gain"), _paper_gain(pub, exp.app, "rate"), why_rate)
        _explain(rep, f"{exp.key} SLO gain", r.get("slo_gain"), _paper_gain(pub, exp.app, "slo"),
                 "the SLO-scale gain is taken at vLLM's goodput rate (the paper does not state its fixed "
                 "rate), and inherits every difference of the rate gain")
    rep.add("Paper: chatbot gains are stated as a range over the three OPT models (§6.2), not per model. "
            "`rate gain` = DistServe's goodput per GPU / vLLM's; `SLO gain` = vLLM's least SLO scale "
            "meeting 90% / DistServe's, both at vLLM's goodput per GPU.", "")
    for r in results:
        if "rate_curve" not in r:
            continue
        png = f"{r['experiment']}.png"
        plot(r, out / png)
        rep.add(f"### {r['figure']}: {r['model'].upper()}, {r['workload']}", "", f"![{r['experiment']}]({png})", "")
    rep.add("## Placements found (Alg. 2)", "")
    prows = []
    for r in results:
        low = r["low_affinity"]
        p = low["pair"]
        prows.append([r["experiment"], len(low["candidates"]), low["simulations"],
                      "-" if p is None else f"pp {p['pp']}, prefill tp {p['tp_p']}, decode tp {p['tp_d']}",
                      "-" if p is None else p["gpus"], _f(p["goodput"] if p else None),
                      low.get("pairs", "-")])
    rep.table(["experiment", "candidates", "simulations", "best pair", "GPUs", "pair goodput (req/s)",
               f"pairs for {PLACEMENT_RPS:g} req/s"], prows)
    pz = pub["placement"]["opt-175b"]
    rep.add(f"Paper (§6.2), OPT-175B chatbot: prefill inter-op {pz['prefill_pp']}, intra-op {pz['prefill_tp']}; "
            f"decode inter-op {pz['decode_pp']}, intra-op {pz['decode_tp']}. Our search considers tensor degrees "
            f"{list(scale.tps)} and up to {scale.max_pp} stages at this scale, and Alg. 2 gives both phases the "
            "same number of stages (segments of one stage share a node).", "")
    abl = [r for r in results if "high_affinity" in r]
    if abl:
        rep.add("## Ablation (Figure 11, OPT-13B ShareGPT)", "")
        arows = []
        for r in abl:
            h = r["high_affinity"]
            vb = r["vllm_pp"]["best"]
            arows.append([r["experiment"], _f(r["vllm"]["per_gpu"]),
                          "-" if vb is None else f"{vb['per_gpu']:.3g} (tp {vb['tp']})",
                          _f(r["low_affinity"]["pair"]["per_gpu"] if r["low_affinity"]["pair"] else None),
                          _f(h.get("phase_per_gpu")),
                          "-" if not h["feasible"] else
                          f"P tp{h['prefill']['tp']} pp{h['prefill']['pp']} ({h['prefill']['goodput']:.3g} req/s), "
                          f"D tp{h['decode']['tp']} pp{h['decode']['pp']} ({h['decode']['goodput']:.3g} req/s)"])
        rep.table(["experiment", "vLLM", "vLLM++", "DistServe-Low", "DistServe-High", "Alg. 1 phases"], arows)
        for r in abl:
            vb, low = r["vllm_pp"]["best"], r["low_affinity"]["pair"]
            high = r["high_affinity"].get("phase_per_gpu")
            same = vb is not None and vb["tp"] == r["vllm"]["tp"]
            rep.add(f"Here ({r['experiment']}): vLLM++ {'is' if same else 'is NOT'} vLLM "
                    f"(best tp {vb['tp'] if vb else '-'}); DistServe-High "
                    f"{'improves on' if high and low and high > low['per_gpu'] else 'does not improve on'} "
                    f"DistServe-Low; DistServe-Low {'beats' if vb and low and low['per_gpu'] > vb['per_gpu'] else 'does not beat'} "
                    "vLLM++.", "")
        rep.add("Paper (§6.4): \"vLLM++ has the same performance as vLLM\" (tp 1 is best per GPU for OPT-13B) and "
                "DistServe-High improves on DistServe-Low (no numbers stated). DistServe-High here is Alg. 1's "
                "phase-level goodput per GPU, 1 / (GPUs_p / goodput_p + GPUs_d / goodput_d), before rounding "
                "replica counts; its decode search counts TTFT too, since a saturated decoder here delays the "
                "first token (admission waits for KV room) where DistServe's delays the next ones.", "")
    rep.add("## Known differences", "",
            "- Performance model: roofline (calibrated on Splitwise's profiles), not DistServe's fitted latency model "
            "(its Appendix A); the A100 figures are the catalog's.",
            "- Workload sizes: synthetic, partly assumed (see Setup); DistServe samples the real datasets.",
            "- KV reservation: splitserve reserves prompt + output KV at admission; DistServe and vLLM page KV as it "
            "grows. Decode-heavy, small instances (tp 1) are limited by KV capacity here.",
            "- Pipeline stages of an instance are packed into nodes in order (perf/pipeline.py); in Alg. 2 each stage "
            "is in a different node, so its activation hops would cross the 25 Gbps network (small: activations only).",
            "- The SLO-scale comparison is at vLLM's goodput rate per GPU (ASSUMED; the paper fixes a rate it does "
            "not state).",
            "- OPT-175B (350 GB of weights) fits an Alg. 2 pair only with pp >= 2; with pp <= 2 and tensor "
            "degrees of powers of two the only pair is pp 2, tp 4 + tp 4, whose two copies of the weights on 16 "
            "GPUs leave little KV room. The paper's choice (pp 3, tp 3 and tp 4, §6.2) needs pp 3 and tp 3, "
            "outside the quick grid (the full scale searches pp up to 4, not tp 3).",
            f"- Scale `{scale.name}`: experiments {', '.join(scale.experiments)}; "
            f"{'OPT-175B is not run at this scale.' if 'chatbot-opt-175b' not in scale.experiments else ''}", "")
    return rep.write()


def reproduce_distserve(out: Path, scale: str = "quick", workers: int | None = None, seed: int = 0,
                        cache_dir: str | None = None, log=print) -> Path:
    from ..errors import UserError

    if scale not in SCALES:
        raise UserError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")
    sc = SCALES[scale]
    out.mkdir(parents=True, exist_ok=True)
    pub = paper()
    ev = Evaluator(LocalBackend(workers), Cache(Path(cache_dir)) if cache_dir else None)
    t0 = time.perf_counter()
    results = []
    try:
        for key in sc.experiments:
            exp = next(e for e in EXPERIMENTS if e.key == key)
            log(f"[{time.perf_counter() - t0:6.0f} s] {exp.figure}: {exp.model}, {exp.workload}")
            results.append(run_experiment(ev, exp, sc, pub, seed))
    finally:
        ev.close()
    wall = time.perf_counter() - t0
    search = {"simulated": ev.simulated, "cached": ev.cached, "workers": ev.width}
    (out / "results.json").write_text(json.dumps({"scale": sc.name, "seed": seed, "wall_s": wall,
                                                  "search": search, "experiments": results},
                                                 indent=1, default=str) + "\n")
    return write_report(out, results, sc, pub, seed, wall, search)
