"""Make src/splitserve/workload/data/{sharegpt,humaneval,longbench}.json: DistServe's three
workloads (seed 002, paper 0, "DistServe", §6.1 and Table 1) as synthetic size distributions.

Where every number comes from, and what is assumed:

- The DistServe paper gives NO numeric length statistics: its Figure 7 ("The input and output
  length distributions of (a) ShareGPT, (b) HumanEval, and (c) LongBench") is an image the text
  copy does not carry, and §6.1 says only that LongBench "has much longer input lengths than the
  other two datasets" and that HumanEval "includes 164 programming problems with a function
  signature or docstring". So every mean below comes from elsewhere or is an ASSUMPTION:
- ShareGPT: mean input 161.31 tokens (min 16, max 3.2K) and mean output 337.99 tokens (min 19,
  max 991): seed 003 (EcoServe), Table 2 "Trace properties", row ShareGPT (the same ShareGPT
  statistics vLLM reports). DistServe's own preprocessing (its artifact's prepare-dataset
  script, LLMServe/DistServe) joins several conversation turns into one prompt and drops
  requests with prompt + output >= 2048 tokens (OPT's context), so its prompts are likely longer:
  a known difference.
- HumanEval: ASSUMPTION, no source numbers seen: prompts (a signature and docstring) of mean 150
  tokens in [40, 600]; outputs (the function body) of mean 70 tokens in [8, 400].
- LongBench: prompts uniform in [1900, 2040] tokens: DistServe's artifact (prepare-dataset
  script) cuts each context to min(2040 - answer, randint(1900, 2048)) tokens; outputs (the
  answers): ASSUMPTION, mean 100 tokens in [4, 500] (no source numbers seen).
- Shape: ASSUMPTION for every size given only by a mean and a range: a log-normal of the stated
  sigma, truncated to [min, max], its location solved so that the mean of what
  workload/synthetic.py samples (linear interpolation between the tabulated quantiles) equals the
  stated mean. Input and output lengths are independent (assumed). Arrivals are Poisson at the rate
  a run asks for (DistServe §6.1: "we generate request arrival times using Poisson distribution");
  `mean_rps` 1.0 is only the default when no rate is given.

Run: python scripts/distserve_workloads.py   (deterministic; no inputs)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import NormalDist

OUT = Path(__file__).resolve().parents[1] / "src" / "splitserve" / "workload" / "data"
N = 256
PROBS = [i / N for i in range(N + 1)]

# name -> (size -> (kind, params, source))
SPECS = {
    "sharegpt": {
        "description": "DistServe chatbot workload (ShareGPT), synthetic",
        "prompt": ("lognormal", dict(mean=161.31, lo=16, hi=3200, sigma=1.0),
                   "mean, min, max: seed 003 (EcoServe) Table 2, ShareGPT input length; sigma 1.0 ASSUMED"),
        "output": ("lognormal", dict(mean=337.99, lo=19, hi=991, sigma=0.8),
                   "mean, min, max: seed 003 (EcoServe) Table 2, ShareGPT output length; sigma 0.8 ASSUMED"),
    },
    "humaneval": {
        "description": "DistServe code-completion workload (HumanEval), synthetic",
        "prompt": ("lognormal", dict(mean=150.0, lo=40, hi=600, sigma=0.5),
                   "ASSUMED (the paper gives no lengths): mean 150, range [40, 600], sigma 0.5"),
        "output": ("lognormal", dict(mean=70.0, lo=8, hi=400, sigma=0.7),
                   "ASSUMED (the paper gives no lengths): mean 70, range [8, 400], sigma 0.7"),
    },
    "longbench": {
        "description": "DistServe summarization workload (LongBench), synthetic",
        "prompt": ("uniform", dict(lo=1900, hi=2040),
                   "uniform [1900, 2040]: DistServe artifact's prepare-dataset cut of each context "
                   "to min(2040 - answer, randint(1900, 2048)) tokens"),
        "output": ("lognormal", dict(mean=100.0, lo=4, hi=500, sigma=0.8),
                   "ASSUMED (the paper gives no lengths): mean 100, range [4, 500], sigma 0.8"),
    },
}


def interp_mean(probs: list[float], q: list[float]) -> float:
    """Mean of inverse-CDF sampling with linear interpolation between tabulated quantiles."""
    return sum((p1 - p0) * (a + b) / 2 for p0, p1, a, b in zip(probs, probs[1:], q, q[1:]))


def lognormal_q(mu: float, sigma: float, lo: float, hi: float, probs: list[float]) -> list[float]:
    """Quantiles at `probs` of a log-normal (mu, sigma) truncated to [lo, hi]."""
    nd = NormalDist()
    f_lo = nd.cdf((math.log(lo) - mu) / sigma)
    f_hi = nd.cdf((math.log(hi) - mu) / sigma)
    out = []
    for p in probs:
        f = min(max(f_lo + p * (f_hi - f_lo), 1e-15), 1 - 1e-15)
        out.append(min(max(math.exp(mu + sigma * nd.inv_cdf(f)), lo), hi))
    out[0], out[-1] = float(lo), float(hi)
    return out


def solve_mu(mean: float, sigma: float, lo: float, hi: float, probs: list[float]) -> float:
    """The location whose truncated, interpolated log-normal has the stated mean (bisection)."""
    a, b = math.log(lo) - 6 * sigma, math.log(hi) + 6 * sigma
    for _ in range(200):
        m = (a + b) / 2
        if interp_mean(probs, lognormal_q(m, sigma, lo, hi, probs)) < mean:
            a = m
        else:
            b = m
    m = (a + b) / 2
    got = interp_mean(probs, lognormal_q(m, sigma, lo, hi, probs))
    assert abs(got - mean) < 1e-3 * mean, f"mean {mean} unreachable in [{lo}, {hi}] at sigma {sigma}: {got}"
    return m


def quantiles(kind: str, p: dict) -> list[float]:
    if kind == "uniform":
        return [p["lo"] + u * (p["hi"] - p["lo"]) for u in PROBS]
    return lognormal_q(solve_mu(p["mean"], p["sigma"], p["lo"], p["hi"], PROBS), p["sigma"], p["lo"], p["hi"], PROBS)


def main() -> None:
    for name, spec in SPECS.items():
        q = {size: quantiles(*spec[size][:2]) for size in ("prompt", "output")}
        doc = {
            "name": name,
            "source": spec["description"] + "; see scripts/distserve_workloads.py for every number's source",
            "method": "empirical quantile function: value at each probability of `probs`, inverse-CDF "
                      "sampling with linear interpolation; sizes independent (ASSUMED)",
            "prompt_source": spec["prompt"][2],
            "output_source": spec["output"][2],
            "mean_prompt_tokens": round(interp_mean(PROBS, q["prompt"]), 2),
            "mean_output_tokens": round(interp_mean(PROBS, q["output"]), 2),
            "mean_rps": 1.0,
            "probs": [round(p, 6) for p in PROBS],
            "prompt_tokens": [round(v, 3) for v in q["prompt"]],
            "output_tokens": [round(v, 3) for v in q["output"]],
        }
        path = OUT / f"{name}.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{path}: mean prompt {doc['mean_prompt_tokens']}, mean output {doc['mean_output_tokens']}")


if __name__ == "__main__":
    main()
