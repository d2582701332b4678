"""`splitserve reproduce distserve --out DIR`: DistServe's end-to-end evaluation (§6.2 Figures 8
and 9, §6.4 Figure 11) on splitserve's simulator: SLO attainment against per-GPU rate and against
SLO scale for DistServe (the placement `provision/placement/` finds, FCFS, no mixed pool) and
vLLM (one colocated instance of the paper's intra-op degree, the `vllm` machine scheduler) and
vLLM++ (the same at its best tensor degree); goodput gains beside the paper's
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
from pathlib import Path

from ..errors import UserError
from ..provision.evaluate import Cache, Evaluator, LocalBackend
from . import distserve_counterfactuals as cf
from .distserve_experiments import EXPERIMENTS, SCALES, paper, run_experiment
from .distserve_probe import Runner
from .distserve_report import write_report
from .versus import roofline_results, run_both


def reproduce_distserve(out: Path, scale: str = "quick", workers: int | None = None, seed: int = 0,
                        cache_dir: str | None = None, log=print, perf_model: str = "auto",
                        versus_roofline: bool = False) -> Path:
    """With `versus_roofline`, the roofline run first into OUT/roofline/ (its counterfactuals
    left out but for the Figure 1 check: the 'why' is this run's), then this one."""
    if scale not in SCALES:
        raise UserError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")

    def run(o: Path, pm: str) -> Path:
        return _run(Path(o), scale, workers, seed, cache_dir, log, pm, counterfactuals=not (versus_roofline and pm == "roofline"))

    return run_both(run, out, perf_model, versus_roofline, log)


def _run(out: Path, scale: str, workers: int | None, seed: int, cache_dir: str | None, log, perf_model: str,
         counterfactuals: bool) -> Path:
    sc = SCALES[scale]
    out.mkdir(parents=True, exist_ok=True)
    pub = paper()
    ev = Evaluator(LocalBackend(workers), Cache(Path(cache_dir)) if cache_dir else None, perf_model=perf_model)
    runner = Runner(workers)
    t0 = time.perf_counter()
    results = []
    try:
        log(f"[{time.perf_counter() - t0:6.0f} s] Figure 1 check ({perf_model})")
        fig1 = cf.figure1(runner, sc, perf_model, seed)
        for key in sc.experiments:
            exp = next(e for e in EXPERIMENTS if e.key == key)
            log(f"[{time.perf_counter() - t0:6.0f} s] {exp.figure}: {exp.model}, {exp.workload} ({perf_model})")
            r = run_experiment(ev, exp, sc, pub, seed)
            if counterfactuals:
                log(f"[{time.perf_counter() - t0:6.0f} s] {exp.figure}: counterfactuals")
                r["counterfactuals"] = cf.experiment(runner, r, sc, seed, perf_model)
            results.append(r)
    finally:
        ev.close()
        runner.close()
    wall = time.perf_counter() - t0
    search = {"simulated": ev.simulated, "cached": ev.cached, "workers": ev.width, "counterfactual_runs": runner.runs}
    res = {"scale": sc.name, "perf_model": perf_model, "seed": seed, "wall_s": wall, "search": search,
           "figure1": fig1, "experiments": results}
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    return write_report(out, res, sc, pub, roofline_results(out))
