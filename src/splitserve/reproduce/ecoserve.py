"""`splitserve reproduce ecoserve --out DIR`: EcoServe's key comparison (§4 Figure 10) on
splitserve's simulator: normalized latency and SLO satisfaction against the request rate, and the
rate each system sustains at the same latency, for EcoServe, vLLM and FastGen on Alpaca, ShareGPT
and BookCorpus, beside the paper's numbers (reproduce/ecoserve_paper.toml). Writes DIR/report.md,
PNG plots and results.json; the claims table and its counterfactuals are ecoserve_claims.py's.

OPT-13B on one A100-80GB with the paper's 12 GB of KV, the `alpaca`, `sharegpt` and `bookcorpus`
workloads at rates around this instance's capacity (the paper's rates are beyond it), vLLM with
KV on demand and reserving without preemption, FastGen as `sarathi`, ORCA with the paper's batch
of 8. A full-scale sweep stops two rates past every limit read, the rates after it overloaded.
The report's Setup and "Other differences" (ecoserve_report.py) say how each system and measure
follows the paper and what is ASSUMED; docs/reproduce.md has the committed run.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from ..errors import UserError
from .ecoserve_experiments import COUNTERFACTUAL, NAMES, SCALES, dataset_results, memory_utilization, paper
from .ecoserve_report import plot_curves, plot_gains, write_report
from .versus import run_both


def run_ecoserve(out: Path, scale: str = "quick", seed: int = 0, log=print, perf_model: str = "auto",
                 versus_roofline: bool = False) -> Path:
    """`reproduce_ecoserve`, first under the roofline into OUT/roofline/ when `versus_roofline`; that
    run leaves out the counterfactual systems (its column holds the claims; the why is this run's)."""
    return run_both(lambda o, pm: reproduce_ecoserve(o, scale, seed, log, pm, counterfactuals=pm != "roofline"
                                                     or not versus_roofline), out, perf_model, versus_roofline, log)


def reproduce_ecoserve(out: Path, scale: str = "quick", seed: int = 0, log=print, perf_model: str = "auto",
                       counterfactuals: bool = True) -> Path:
    if scale not in SCALES:
        raise UserError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")
    sc = replace(SCALES[scale], perf_model=perf_model)
    if not counterfactuals:
        sc = replace(sc, systems=tuple(s for s in sc.systems if s not in COUNTERFACTUAL))
    out.mkdir(parents=True, exist_ok=True)
    pub = paper()
    t0 = time.perf_counter()
    results = []
    for ds in sc.datasets:
        log(f"[{time.perf_counter() - t0:6.1f} s] {NAMES[ds]}: {', '.join(sc.systems)} at "
            f"{', '.join(f'{r:g}' for r in sc.rates[ds])} req/s")
        results.append(dataset_results(ds, sc, seed, log))
    res = {"scale": sc.name, "perf_model": perf_model, "seed": seed, "kv_tokens": results[0]["kv_tokens"],
           "memory_utilization": memory_utilization(), "datasets": results,
           "simulations": sum(len(ps) for d in results for ps in d["points"].values()),
           "wall_s": time.perf_counter() - t0}
    plot_curves(results, out / "curves.png")
    plot_gains(results, pub, out / "gains.png")
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    return write_report(out, res, sc, pub)
