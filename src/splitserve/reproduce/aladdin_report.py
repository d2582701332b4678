"""Aladdin's report: the two figures (GPUs needed against the arrival rate) and report.md, one
function per section, the largest reductions beside the paper's."""

from __future__ import annotations

from pathlib import Path

from .aladdin_claims import claims_section, counterfactual_section
from .aladdin_experiments import FIG11, FIG12, MODEL, NAMES, SCALES, TARGET, WORKLOAD, prompt_workers
from .markdown import Report
from .plots import plt


def _reduction(ours: int | None, base: int | None) -> float | None:
    return None if ours is None or base is None or base == 0 else 1.0 - ours / base


def plot_figures(res: dict, out: Path) -> None:
    for fig, kinds, ylabel in (("fig11", FIG11, "GPUs needed"), ("fig12", FIG12, "decode GPUs needed")):
        f, ax = plt.subplots(figsize=(6.4, 4.2), constrained_layout=True)
        for k in kinds:
            pts = [(r, g) for r, g in zip(res["rates"], res["gpus"][k]) if g is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=NAMES[k])
        if fig == "fig11":
            ax.plot(res["rates"], [res["scaled"][str(r)].get("mean_active", 0) for r in res["rates"]],
                    linestyle="--", marker="x", label="Aladdin theta 0.7 scaling JSQ's pool (mean GPUs on)")
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{'Figure 11' if fig == 'fig11' else 'Figure 12'}: Llama2-13B, ShareGPT, "
                     f">= {TARGET:.0%} within SLOs")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        f.savefig(out / f"{fig}.png", dpi=110)
        plt.close(f)


def _fmt(x) -> str:
    return "-" if x is None else (f"{x:.0%}" if isinstance(x, float) else str(x))


def write_report(res: dict, pub: dict, out: Path, roofline: dict | None = None) -> Path:
    """report.md of one run's results.json `res`, its claims beside `roofline`'s (the roofline
    run's results.json) when there is one."""
    rep = Report(out)
    _setup(rep, res, pub)
    claims_section(rep, res, pub, roofline)
    _figure11(rep, res)
    _figure12(rep, res)
    _claims(rep, res, pub)
    counterfactual_section(rep, res)
    _differences(rep, res)
    return rep.write()


def _setup(rep: Report, res: dict, pub: dict) -> None:
    rep.add("# Aladdin on splitserve's simulator", "",
            f"`splitserve reproduce aladdin --scale {res['scale']} --perf-model {res.get('perf_model', 'auto')}` "
            f"({res['wall_s']:.0f} s). Aladdin "
            "(Nie et al., 2024) co-adapts request placement and worker scaling; its key result is the "
            "GPUs needed to serve a stream within the SLOs (§6.4, Figures 11 and 12).", "",
            "## Setup", "",
            f"- {MODEL} on A100s, `{WORKLOAD}` sizes, Poisson arrivals, "
            f"{SCALES[res['scale']].duration:g} s of arrivals per simulation, seed {res['seed']}.",
            f"- SLOs by the paper's rules on our perf model: TTFT {res['slo']['ttft_s'] * 1e3:.0f} ms (the "
            f"prefill of 4096 tokens; paper {pub['setup']['ttft_slo_s'] * 1e3:.0f} ms on its A100), ATGT "
            f"{res['slo']['atgt_s'] * 1e3:.1f} ms (1.3 x a lone decode step at 4096; paper "
            f"{pub['setup']['atgt_slo_s'] * 1e3:.0f} ms).",
            f"- GPUs needed: the fewest workers with >= {TARGET:.0%} of requests within both SLOs "
            "(the paper: P100), times GPUs per worker.",
            "- Figure 11: vLLM's prefill-first iterations on every worker; vLLM with 4 GPUs per worker "
            "and JSQ, JSQ with 1 GPU per worker (Table 3's optimum), Aladdin's placement with 1 GPU per "
            "worker (no scaling; its 100-token bucket predictor). Figure 12: decode workers of a split "
            "cluster (prompt workers fixed at 1 + ceil(rate / 8)), JSQ, TetriInfer's power of two, Aladdin.",
            "- KV on demand on every worker, as vLLM allocates it (a prompt waits for its blocks and a 1% "
            "watermark, a decode that finds no block preempts the last-joined decode, recomputed later).", "")


def _figure11(rep: Report, res: dict) -> None:
    rates, g = res["rates"], res["gpus"]
    rep.add("## Figure 11: default continuous batching", "", "![](fig11.png)", "")
    rows = []
    for i, r in enumerate(rates):
        sc = res["scaled"][str(r)]
        rows.append([f"{r:g}", _fmt(g["vllm"][i]), _fmt(g["jsq"][i]), _fmt(g["aladdin"][i]), _fmt(g["aladdin-0.7"][i]),
                     _fmt(_reduction(g["aladdin-0.7"][i], g["vllm"][i])),
                     _fmt(_reduction(g["aladdin-0.7"][i], g["jsq"][i])),
                     f"{sc.get('mean_active', 0):.1f} of {sc['pool']} ({sc['attainment']:.1%})"])
    rep.table(["req/s", "vLLM GPUs", "JSQ GPUs", "Aladdin 0.9 GPUs", "Aladdin 0.7 GPUs", "0.7 vs vLLM",
               "0.7 vs JSQ", "Aladdin 0.7 scaling JSQ's pool: mean GPUs on (attainment)"], rows)
    rep.add("- (no number: no worker count up to the search bound meets the target.) Aladdin packs every "
            "worker to its SLO model's limit whatever the cluster's size, so more workers do not help when "
            "its model is optimistic: constraint (d) lets a decode's saved time be used up to theta of it, and "
            "later arrivals lengthen the batch, so a few percent of requests end with an ATGT just over the SLO. "
            "theta 0.7 was the first value tried (on earlier roofline runs at 12 and 24 req/s) that met 99%: it is "
            "the paper's knob for this error, its value unstated (ASSUMED).", "")


def _figure12(rep: Report, res: dict) -> None:
    rates, g = res["rates"], res["gpus"]
    rep.add("## Figure 12: split phase, decode GPUs", "", "![](fig12.png)", "")
    rows = [[f"{r:g}", prompt_workers(r), _fmt(g["split-jsq"][i]), _fmt(g["split-p2"][i]), _fmt(g["split-aladdin"][i]),
             _fmt(_reduction(g["split-aladdin"][i], g["split-jsq"][i])),
             _fmt(_reduction(g["split-aladdin"][i], g["split-p2"][i]))] for i, r in enumerate(rates)]
    rep.table(["req/s", "prompt workers", "JSQ", "Power of two", "Aladdin", "vs JSQ", "vs power of two"], rows)


def _claims(rep: Report, res: dict, pub: dict) -> None:
    g = res["gpus"]

    def best(a: str, b: str) -> float | None:
        xs = [x for x in (_reduction(p, q) for p, q in zip(g[a], g[b])) if x is not None]
        return max(xs) if xs else None

    claims = [("Figure 11: Aladdin (theta 0.7) vs default vLLM", best("aladdin-0.7", "vllm"),
               pub["figure11"]["reduction_vs_vllm"]),
              ("Figure 11: Aladdin (theta 0.7) vs JSQ, optimal workers", best("aladdin-0.7", "jsq"),
               pub["figure11"]["reduction_vs_jsq"]),
              ("Figure 11: Aladdin (theta 0.9) vs JSQ, optimal workers", best("aladdin", "jsq"),
               pub["figure11"]["reduction_vs_jsq"]),
              ("Figure 12: Aladdin vs JSQ (decode)", best("split-aladdin", "split-jsq"), pub["figure12"]["reduction_vs_jsq"]),
              ("Figure 12: Aladdin vs power of two (decode)", best("split-aladdin", "split-p2"),
               pub["figure12"]["reduction_vs_power_of_two"])]
    rep.add("## Largest reductions beside the paper's", "")
    rep.table(["claim", "ours (largest over the rates)", "paper (up to)"], [[c, _fmt(o), _fmt(p)] for c, o, p in claims])


def _differences(rep: Report, res: dict) -> None:
    rates = res["rates"]
    rep.add("## What differs and why", "",
            "- SLOs: our perf model's lone decode step of Llama2-13B on an A100 is "
            f"{res['slo']['atgt_s'] / 1.3 * 1e3:.1f} ms and its 4,096-token prefill {res['slo']['ttft_s'] * 1e3:.0f} ms; "
            "the paper's SLOs (Table 2) are 30 ms and 600 ms. The rule (1.3x the lone step) sets the relative "
            "packing room, not the milliseconds; the Counterfactuals run the paper's milliseconds.",
            "- Default vLLM: its count moves in steps of 4 GPUs, so Aladdin's reduction against it is its "
            "reduction against JSQ plus that rounding and whatever a 4-GPU worker loses per GPU (compare its "
            "column with JSQ's). The paper's 71% against 40% implies its 4-GPU workers served fewer requests per "
            "GPU than its 1-GPU ones (its Table 3 picks 1 GPU); its testbed joins the GPUs by PCIe, which the "
            "Counterfactuals run.",
            "- Figure 12: every dispatcher fills a token worker up to the same decode batch time (the ATGT "
            "binds before KV memory here), and JSQ over pending tokens balances those batches nearly as "
            "well as packing; the paper's 60% over JSQ is not reproduced, and its text does not say what "
            "limits its JSQ (our reading, not measured).",
            "- Outputs: `sharegpt` is a fit of ShareGPT's lengths (DistServe's), not Llama2-13B's own outputs; "
            "the predictor is a 100-token bucket classifier at 58.9% (TetriInfer's), where the paper uses "
            "the mean output per prompt length (its accuracy unstated).",
            "- KV is allocated on demand, so an Aladdin placement that overbooks its predicted KV peak "
            "admits the request and preempts (recomputes) a decode later, as vLLM would; before on-demand "
            "allocation the request waited for its whole reservation instead.",
            f"- P100 vs >= {TARGET:.0%}: the last percent of requests (the largest prompts queued behind "
            "others) decides P100 in a finite sample; the paper's simulation draws outputs from a CDF and "
            "reports P100 of its own model.",
            "- The paper's Figures 11 and 12 are plots whose per-rate values its text does not state; only the "
            "largest reductions are compared. Our rates reach "
            f"{max(rates):g} req/s (the paper's simulation: around 25).", "")
    rep.add("## Known differences", "",
            "- Aladdin's worker configuration search (Eq. 5 and 6) is not run: 1 GPU per worker is taken "
            "from Table 3.",
            "- Scaling (Eq. 7) takes its coefficients from the latency model, not from fits to runs of "
            "Algorithm 1; the scaled run's mean GPUs on is beside the searched minimum, not in it.", "")
