"""`splitserve reproduce tetriinfer --out DIR`: TetriInfer's end-to-end evaluation (§5.1 Figures
11-15) on splitserve's simulator: average TTFT, average JCT and resource usage time of TetriInfer
against vLLM on its five workloads (LPLD, LPHD, HPLD, HPHD, Mixed), and perf per dollar, beside the
paper's numbers (reproduce/tetriinfer_paper.toml); then its instance flip (§3.5) under a load
shift. Writes DIR/report.md, PNG plots and results.json. The report opens with the claims table
(tetriinfer_claims.py: ours under this run's step-time model and, with
`run_tetriinfer(versus_roofline=True)`, under the roofline run into DIR/roofline/), each claim's
"why" backed by counterfactual runs.

vLLM is one instance, TetriInfer one prefill and one decode instance, both allocating KV on demand,
OPT-13B on A100-80GBs (the paper's V100s are not in the catalog), 128 requests per workload
arriving at once (the paper states no rate). The report's Setup (tetriinfer_report.py) says how
each follows the paper and what is ASSUMED, perf per dollar included; docs/reproduce.md has the
committed run.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from ..errors import UserError
from .tetriinfer_claims import counterfactuals as run_counterfactuals
from .tetriinfer_experiments import NAMES, SCALES, compare, flip_experiment, kv_tokens, paper
from .tetriinfer_report import plot_main, plot_rates, write_report
from .versus import run_both


def run_tetriinfer(out: Path, scale: str = "quick", seed: int = 0, log=print, perf_model: str = "auto",
                   versus_roofline: bool = False) -> Path:
    """`reproduce_tetriinfer`, first under the roofline into OUT/roofline/ when `versus_roofline`
    (the claims table then has both columns)."""
    return run_both(lambda o, pm: reproduce_tetriinfer(o, scale, seed, log, pm, counterfactuals=pm != "roofline"
                                                       or not versus_roofline), out, perf_model, versus_roofline, log)


def reproduce_tetriinfer(out: Path, scale: str = "quick", seed: int = 0, log=print, perf_model: str = "auto",
                         counterfactuals: bool = True) -> Path:
    if scale not in SCALES:
        raise UserError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")
    sc = replace(SCALES[scale], seeds=tuple(s + seed for s in SCALES[scale].seeds), perf_model=perf_model)
    out.mkdir(parents=True, exist_ok=True)
    pub = paper()
    t0 = time.perf_counter()
    main, rates = [], []
    for w in sc.workloads:
        log(f"[{time.perf_counter() - t0:6.1f} s] {NAMES[w]}: all at once, {', '.join(sc.links)}; "
            f"Poisson {', '.join(f'{r:g}' for r in sc.rates)} req/s")
        main += [compare(w, sc, link, None) for link in sc.links]
        rates += [compare(w, sc, sc.links[0], r) for r in sc.rates]
    log(f"[{time.perf_counter() - t0:6.1f} s] instance flip under a load shift")
    flip = flip_experiment(sc)
    cf = None
    if counterfactuals:
        log(f"[{time.perf_counter() - t0:6.1f} s] counterfactuals")
        cf = run_counterfactuals(sc, log)
    sims = (2 * len(sc.seeds) * (len(main) + len(rates)) + len(flip["runs"])
            + (2 * len(cf["seeds"]) * len(cf["runs"]) if cf else 0))
    res = {"scale": sc.name, "perf_model": perf_model, "seeds": list(sc.seeds), "kv_tokens": kv_tokens(), "main": main, "rates": rates,
           "flip": flip, **({"counterfactuals": cf} if cf else {}), "simulations": sims, "wall_s": time.perf_counter() - t0}
    plot_main([m for m in main if m["link"] == sc.links[0]], pub, out / "workloads.png")
    plot_rates(rates, out / "rates.png")
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    return write_report(out, res, sc, pub)
