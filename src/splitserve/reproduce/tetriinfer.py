"""`splitserve reproduce tetriinfer --out DIR`: TetriInfer's end-to-end evaluation (seed 002, paper 4,
§5.1 Figures 11-15) on splitserve's simulator: average TTFT, average JCT and resource usage time of
TetriInfer against vLLM on its five workloads (LPLD, LPHD, HPLD, HPHD, Mixed), and perf per dollar,
beside the paper's numbers (reproduce/tetriinfer_paper.toml); then its instance flip (§3.5) under a
load shift. Writes DIR/report.md, PNG plots and results.json. The report opens with the claims
table (tetriinfer_claims.py: each figure of §5.1, ours under this run's step-time model and, with
`run_tetriinfer(versus_roofline=True)`, under the roofline run into DIR/roofline/) and backs each
claim's "why" with counterfactual runs (tetriinfer_claims.py; left out of that roofline run).

The setup, as the paper gives it and where it does not (ASSUMED):
- vLLM: one instance, the `vllm` system (prefill-first iterations, KV on demand as vLLM's paged
  blocks: a prompt waits for its blocks and a 1% watermark and preempts nobody, a decode that finds
  no block for its next token preempts the last-joined decode, recomputed later; preemption limit
  0, so the last-joined always goes first, as in vLLM). Before on-demand allocation it reserved
  each request's prompt + output, with no preemption (the `reserve` counterfactual runs that).
  TetriInfer: one prefill and one decode instance ("twice the number of hardware cards", §5.1), the
  `tetriinfer` system with the SJF prefill scheduler of §5.1 (512-token chunks), its decode
  dispatch and its 200-token bucket predictor (74.9%), instance flips after a minute idle; KV on
  demand on both of its instances, as the system's rule (policy/systems.py: it runs on vLLM).
- Hardware: one A100-80GB per instance (ASSUMED: the catalog has no V100; the paper ran OPT-13B on
  V100-32GB cards), OPT-13B, tp 1. KV moves over the machines' network (TS-RoCE) or NVLink
  (TS-NVLink, `colocated`).
- Requests: 128 per workload, sizes from the `tetri-*` workloads (scripts/neighbour_workloads.py),
  clipped to OPT's 2,048-token context. Arrivals: ASSUMED all at once (the paper states no rate;
  a batch of 128 is how it words every run); a table beside it gives Poisson rates.
- Resource usage time (§5.1: "the aggregated wall time that the prefill and decode instances use
  to run a particular workload"): per instance, from the first arrival to the end of its last
  work (a prefill instance's last first token, a decode instance's last token), summed; an
  instance is recycled once it has no more work (ASSUMED, as "TetriInfer can recycle or flip
  instances"). vLLM's is its total runtime.
- Perf per dollar: the paper gives no formula; ASSUMED (1 / average JCT) / resource usage time,
  all instances costing the same per second. From the paper's own JCT and resource figures this
  gives 3.0x for LPHD (it states 2.4x) and 2.5x for Mixed (1.9x): the report shows both.
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
