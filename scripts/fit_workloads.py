"""Fit the synthetic `coding` and `conversation` workloads to the Azure LLM inference traces of
2023 and write src/splitserve/workload/data/{coding,conversation}.json.

    python scripts/fit_workloads.py [--traces ../shared/traces]

The fit is the empirical quantile function of each size (257 quantiles, sampled by inverse CDF
with linear interpolation between them), plus the trace's mean arrival rate. Prompt and output
sizes are sampled independently: their rank correlation is -0.02 (coding) and 0.07
(conversation), too small to model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from splitserve.workload.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
TRACES = {"coding": "azure_2023_code.csv", "conversation": "azure_2023_conv.csv"}
PROBS = np.linspace(0.0, 1.0, 257)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default=str(ROOT.parent / "shared" / "traces"))
    args = ap.parse_args()
    for name, file in TRACES.items():
        tr = load_trace(Path(args.traces) / file)
        fit = {
            "name": name,
            "source": f"fitted to the Azure LLM inference trace 2023 ({file}), Microsoft, CC-BY 4.0",
            "method": "empirical quantile function: value at each probability of `probs`, "
                      "inverse-CDF sampling with linear interpolation; sizes independent",
            "requests": len(tr),
            "trace_duration_s": round(tr.duration, 3),
            "mean_rps": round((len(tr) - 1) / tr.duration, 4),
            "rank_correlation": round(spearman(tr.prompt_tokens, tr.output_tokens), 4),
            "probs": [round(float(p), 6) for p in PROBS],
            "prompt_tokens": [round(float(q), 2) for q in np.quantile(tr.prompt_tokens, PROBS)],
            "output_tokens": [round(float(q), 2) for q in np.quantile(tr.output_tokens, PROBS)],
        }
        out = ROOT / "src" / "splitserve" / "workload" / "data" / f"{name}.json"
        out.write_text(json.dumps(fit, indent=1) + "\n")
        print(f"{name}: {len(tr)} requests, median prompt {np.median(tr.prompt_tokens):.0f}, "
              f"median output {np.median(tr.output_tokens):.0f}, rank corr {fit['rank_correlation']}, "
              f"{fit['mean_rps']} req/s -> {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
