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
- Every worker allocates KV on demand, as vLLM does and Aladdin runs on it (policy/systems.py):
  a request holds the blocks of the tokens it has, a prompt waits for its blocks and a 1%
  watermark, a decode that finds no block preempts the last-joined decode (recomputed later).
  Before on-demand allocation every worker here reserved each request's prompt + output.
- Figure 12 (split phase, decode GPUs only, as the paper): prompt workers fixed at
  1 + ceil(rate / 8) for every dispatcher (ASSUMED; the paper does not simulate them); the token
  workers needed under JSQ (DistServe's), power of two (TetriInfer's decode dispatch: two at random
  among those with memory for the predicted output) and Aladdin's split placement.
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
