"""`splitserve reproduce aladdin --out DIR`: Aladdin's key result (seed 002, paper 2, §6.4 Figures 11
and 12) on splitserve's simulator: the GPUs needed to serve a Poisson stream within the SLOs at each
arrival rate, for Aladdin (policy/aladdin.py) and its baselines, beside the reductions the paper
states (reproduce/aladdin_paper.toml). Writes DIR/report.md, fig11.png, fig12.png, results.json.

The setup, as the paper gives it and where it does not (ASSUMED):
- Llama2-13B on A100s (Table 2), ShareGPT sizes (the `sharegpt` workload, DistServe's fit of it;
  the paper replays ShareGPT prompts with its own model's outputs), Poisson arrivals.
- SLOs by the paper's rules (§6.1) on our perf model: TTFT the prefill time of 4096 tokens, ATGT
  1.3 times a lone request's decode step at 4096 tokens (one A100). A request meets them when its
  TTFT and its average token generation time (report/goodput.py's TPOT, the same quantity) both
  do. The paper counts the GPUs for P100 (every request); ASSUMED here: at least 99%, since
  the single slowest request of a finite random sample decides P100.
- Figure 11 (default continuous batching, every worker prefills and decodes, vLLM's prefill-first
  iterations): vLLM as deployed by default, 4 GPUs per worker (tp 4) with JSQ; JSQ over Aladdin's
  optimal worker (1 GPU, Table 3); Aladdin's placement over the same workers (its SLOs those
  above, its 100-token bucket predictor, no scaling; --aladdin-theta 0.9, its default, and 0.7:
  the report says why). GPUs needed: the fewest workers meeting the
  target, times GPUs per worker. Aladdin with scaling beside: the pool JSQ needs, its active
  workers following Eq. 7 (`--scale-window`), the mean number on.
- Figure 12 (split phase, decode GPUs only, as the paper): prompt workers fixed at
  1 + ceil(rate / 8) for every dispatcher (ASSUMED; the paper does not simulate them); the token
  workers needed under JSQ (DistServe's), power of two (TetriInfer's decode dispatch: two at random
  among those with memory for the predicted output) and Aladdin's split placement.
"""

from __future__ import annotations

import json
import math
import time
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .markdown import Report
from .plots import plt

MODEL = "llama2-13b"
HARDWARE = "dgx-a100"
WORKLOAD = "sharegpt"
TARGET = 0.99                 # ASSUMED in place of P100 (see above)
FIG11 = ("vllm", "jsq", "aladdin", "aladdin-0.7")
FIG12 = ("split-jsq", "split-p2", "split-aladdin")
NAMES = {"vllm": "vLLM (4 GPUs/worker, JSQ)", "jsq": "JSQ (1 GPU/worker)", "aladdin": "Aladdin, theta 0.9",
         "aladdin-0.7": "Aladdin, theta 0.7",
         "split-jsq": "JSQ", "split-p2": "Power of two", "split-aladdin": "Aladdin"}
GPUS = {"vllm": 4}            # GPUs per worker (1 otherwise)
THETAS = {"aladdin": 0.9, "aladdin-0.7": 0.7}   # --aladdin-theta (see the module's docstring)


def paper() -> dict:
    return tomllib.loads(resources.files("splitserve.reproduce").joinpath("aladdin_paper.toml").read_text())


@dataclass(frozen=True)
class Scale:
    name: str
    rates: tuple[float, ...]       # req/s
    duration: float                # seconds of arrivals per simulation
    max_workers: int               # search bound
    window: float                  # --scale-window of the scaled run


TINY = Scale("tiny", (2.0, 6.0), 20.0, 24, 10.0)
QUICK = Scale("quick", (2.0, 6.0, 12.0, 18.0, 24.0), 60.0, 64, 20.0)
FULL = Scale("full", (2.0, 4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 28.0), 300.0, 96, 30.0)
SCALES = {s.name: s for s in (TINY, QUICK, FULL)}


def slos() -> tuple[float, float]:
    """(TTFT, ATGT) SLOs, seconds: the paper's rules (§6.1) on one A100 of our perf model."""
    from ..catalog import load_hardware, load_model
    from ..perf import make_perf_model
    from ..policy.aladdin import ATGT_FACTOR, TTFT_CONTEXT
    perf, _ = make_perf_model(load_model(MODEL), load_hardware(HARDWARE), 1)
    return perf.prompt_time(TTFT_CONTEXT), ATGT_FACTOR * perf.token_time(1, TTFT_CONTEXT)


def prompt_workers(rate: float) -> int:
    return 1 + math.ceil(rate / 8)


def simulate(kind: str, workers: int, rate: float, scale: Scale, seed: int, window: float = 0.0) -> dict:
    """One run of `kind` with `workers` workers (token workers for the split kinds) at `rate`."""
    from ..catalog import load_model
    from ..designs import Parallelism, make_cluster
    from ..policy.cluster import RoutingConfig
    from ..policy.config import PolicyConfig
    from ..policy.machine import BatchingConfig
    from ..report.goodput import GoodputSLO
    from ..sim.simulator import SimConfig, Simulation
    from ..workload import make_workload

    ttft, atgt = slos()
    aladdin = dict(cluster_scheduler="aladdin", predictor="tetriinfer-100", aladdin_ttft_slo=ttft,
                   aladdin_atgt_slo=atgt, scale_window=window, aladdin_theta=THETAS.get(kind, 0.9))
    if kind in FIG11:
        routing = RoutingConfig(**aladdin) if kind in THETAS else RoutingConfig(cluster_scheduler="jsq")
        cluster = make_cluster("baseline-a100", machines=workers, parallel=Parallelism(tp=GPUS.get(kind, 1)))
        batching = BatchingConfig(scheduler="vllm")
    else:
        routing = {"split-jsq": RoutingConfig(mixed_pool=False),
                   "split-p2": RoutingConfig(mixed_pool=False, decode_dispatch="tetriinfer", predictor="tetriinfer-100"),
                   "split-aladdin": RoutingConfig(mixed_pool=False, **aladdin)}[kind]
        cluster = make_cluster("splitwise-aa", prompt_machines=prompt_workers(rate), token_machines=workers,
                               parallel=Parallelism(tp=1))
        batching = BatchingConfig()
    cfg = SimConfig(policy=PolicyConfig(batching=batching, routing=routing), goodput=GoodputSLO(ttft, atgt))
    wl = make_workload(WORKLOAD, rps=rate, duration=scale.duration, seed=seed)
    res = Simulation(cluster, load_model(MODEL), wl, cfg).run()
    mt = res.metrics
    out = {"workers": workers, "attainment": mt.attained / mt.requests if mt.requests else 1.0,
           "requests": mt.requests}
    if res.scaling is not None and window > 0:
        span = res.sim_end - mt.first_arrival
        out["mean_active"] = sum(res.scaling["machine_seconds"].values()) / span if span > 0 else 0.0
        out["scale_downs"] = res.scaling["scale_downs"]
    return out


def needed(kind: str, rate: float, scale: Scale, seed: int, runs: dict) -> int | None:
    """The fewest workers of `kind` meeting TARGET at `rate` (doubling, then bisection; attainment
    taken as monotone in workers), None past `scale.max_workers`. Every run lands in `runs`."""
    def ok(n: int) -> bool:
        if n not in runs:
            runs[n] = simulate(kind, n, rate, scale, seed)
        return runs[n]["attainment"] >= TARGET

    hi = 1
    while not ok(hi):
        if hi >= scale.max_workers:
            return None
        hi = min(2 * hi, scale.max_workers)
    lo = hi // 2                     # fails (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def reproduce_aladdin(out: Path, scale: str = "quick", seed: int = 0, log=print) -> Path:
    if scale not in SCALES:
        from ..errors import UserError
        raise UserError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")
    sc = SCALES[scale]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ttft, atgt = slos()
    results: dict = {"scale": sc.name, "seed": seed, "target": TARGET, "slo": {"ttft_s": ttft, "atgt_s": atgt},
                     "rates": list(sc.rates), "gpus": {}, "runs": {}, "scaled": {}}
    for kind in FIG11 + FIG12:
        results["gpus"][kind] = []
        results["runs"][kind] = []
        for rate in sc.rates:
            runs: dict = {}
            n = needed(kind, rate, sc, seed, runs)
            results["gpus"][kind].append(None if n is None else n * GPUS.get(kind, 1))
            results["runs"][kind].append({str(k): v for k, v in sorted(runs.items())})
            log(f"{kind} at {rate:g} req/s: {n} workers ({len(runs)} simulations, {time.perf_counter() - t0:.0f} s)")
    for i, rate in enumerate(sc.rates):   # Aladdin scaling a pool the size JSQ needs
        pool = results["gpus"]["jsq"][i] or sc.max_workers
        results["scaled"][str(rate)] = {"pool": pool, **simulate("aladdin-0.7", pool, rate, sc, seed, window=sc.window)}
    results["wall_s"] = time.perf_counter() - t0
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    _plots(results, out)
    return _report(results, paper(), out)


def _reduction(ours: int | None, base: int | None) -> float | None:
    return None if ours is None or base is None or base == 0 else 1.0 - ours / base


def _plots(res: dict, out: Path) -> None:
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


def _report(res: dict, pub: dict, out: Path) -> Path:
    rep = Report(out)
    rates = res["rates"]
    g = res["gpus"]
    rep.add("# Aladdin on splitserve's simulator", "",
            f"`splitserve reproduce aladdin --scale {res['scale']}` ({res['wall_s']:.0f} s). Aladdin "
            "(seed 002 paper 2) co-adapts request placement and worker scaling; its key result is the "
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
            "cluster (prompt workers fixed at 1 + ceil(rate / 8)), JSQ, TetriInfer's power of two, Aladdin.", "")
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
            "its model is optimistic: with theta 0.9 (and 0.85, 0.8, tried by hand at 12 and 24 req/s) 1.5-3.6% "
            "of requests end with an ATGT just over the SLO (at most 42.6 ms for 41.6 ms in the runs inspected, "
            "none over the TTFT SLO): constraint (d) lets a decode's saved time be used up to theta of it, and "
            "later arrivals lengthen the batch. theta 0.7 was the first value "
            "tried that met 99% at both rates: it is the paper's knob for this error, its value unstated "
            "(ASSUMED, chosen on these runs).", "")
    rep.add("## Figure 12: split phase, decode GPUs", "", "![](fig12.png)", "")
    rows = [[f"{r:g}", prompt_workers(r), _fmt(g["split-jsq"][i]), _fmt(g["split-p2"][i]), _fmt(g["split-aladdin"][i]),
             _fmt(_reduction(g["split-aladdin"][i], g["split-jsq"][i])),
             _fmt(_reduction(g["split-aladdin"][i], g["split-p2"][i]))] for i, r in enumerate(rates)]
    rep.table(["req/s", "prompt workers", "JSQ", "Power of two", "Aladdin", "vs JSQ", "vs power of two"], rows)

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
    rep.add("## What differs and why", "",
            "- SLOs: our perf model's lone decode step of Llama2-13B on an A100 is "
            f"{res['slo']['atgt_s'] / 1.3 * 1e3:.0f} ms, the paper's SLO is 30 ms: applying its rule (1.3x) to "
            "ours gives a looser absolute ATGT and a TTFT from our prefill model; the relative packing room "
            "is what the rule sets, not the milliseconds.",
            "- Default vLLM: its count moves in steps of 4 GPUs, and with our roofline (tensor parallelism "
            "pays its all-reduces, nothing else) a 4-GPU worker serves about as much as four 1-GPU ones "
            "(compare its column with JSQ's), so Aladdin's reduction against it is mostly its reduction "
            "against JSQ plus that rounding. The paper's 71% against 40% implies its 4-GPU workers served "
            "fewer requests per GPU than its 1-GPU ones (its Table 3 picks 1 GPU).",
            "- Figure 12: every dispatcher fills a token worker up to the same decode batch time (the ATGT "
            "binds before KV memory here), and JSQ over pending tokens balances those batches nearly as "
            "well as packing; the paper's 60% over JSQ is not reproduced, and its text does not say what "
            "limits its JSQ (our reading, not measured).",
            "- Outputs: `sharegpt` is a fit of ShareGPT's lengths (DistServe's), not Llama2-13B's own outputs; "
            "the predictor is a 100-token bucket classifier at 58.9% (TetriInfer's), where the paper uses "
            "the mean output per prompt length (its accuracy unstated).",
            "- splitserve reserves each request's whole KV at admission, so an Aladdin placement that "
            "overbooks its predicted KV peak waits for memory instead of being preempted later.",
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
    return rep.write()
