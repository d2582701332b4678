"""`splitserve reproduce aladdin --out DIR`: Aladdin's key result (§6.4 Figures 11 and 12) on
splitserve's simulator: the GPUs needed to serve a Poisson stream within the SLOs at each arrival
rate, for Aladdin (policy/aladdin.py) and its baselines, beside the reductions the paper states
(reproduce/aladdin_paper.toml). Writes DIR/report.md, fig11.png, fig12.png, results.json.

Llama2-13B on A100s, ShareGPT sizes, SLOs by the paper's rules (§6.1) on our perf model, every
worker allocating KV on demand as vLLM does; GPUs needed are the fewest workers meeting the SLOs
for at least 99% of requests (the paper's P100 is decided by a sample's single slowest request),
times GPUs per worker. The report's Setup and "What differs and why" (aladdin_report.py) say how
each system follows the paper and what is ASSUMED; docs/reproduce.md has the committed run.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from ..errors import UserError
from . import aladdin_counterfactuals
from .aladdin_experiments import FIG11, FIG12, GPUS, SCALES, TARGET, needed, paper, simulate, slos
from .aladdin_report import plot_figures, write_report
from .versus import roofline_results, run_both


def reproduce_aladdin(out: Path, scale: str = "quick", seed: int = 0, log=print, perf_model: str = "auto",
                      versus_roofline: bool = False) -> Path:
    """With `versus_roofline`, the roofline run first into OUT/roofline/ (without counterfactuals:
    the 'why' is this run's), then this one."""
    if scale not in SCALES:
        raise UserError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")

    def run(o: Path, pm: str) -> Path:
        return _run(Path(o), scale, seed, log, pm, counterfactuals=not (versus_roofline and pm == "roofline"))

    return run_both(run, out, perf_model, versus_roofline, log)


def _run(out: Path, scale: str, seed: int, log, perf_model: str, counterfactuals: bool) -> Path:
    sc = replace(SCALES[scale], perf_model=perf_model)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ttft, atgt = slos(perf_model)
    results: dict = {"scale": sc.name, "perf_model": perf_model, "seed": seed, "target": TARGET, "slo": {"ttft_s": ttft, "atgt_s": atgt},
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
    if counterfactuals:
        results["counterfactuals"] = aladdin_counterfactuals.run(sc, seed, aladdin_counterfactuals.cf_rate(results), log,
                                                                   results)
    results["wall_s"] = time.perf_counter() - t0
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    plot_figures(results, out)
    return write_report(results, paper(), out, roofline_results(out))
