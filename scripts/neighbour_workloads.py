"""Make src/splitserve/workload/data/{tetri-lpld,tetri-lphd,tetri-hpld,tetri-hphd,tetri-mixed,
alpaca,bookcorpus}.json: the workloads TetriInfer and EcoServe evaluate on, as synthetic size
distributions (issue 16 item 3). Same method as scripts/distserve_workloads.py.

Where every number comes from, and what is assumed:

- TetriInfer (seed 002, paper 4, "Inference without Interference", §5.1 "End-to-End
  Performance"): five workloads, HPLD, HPHD, LPHD, LPLD and Mixed, each of 128 requests
  "generated using samples from the ShareGPT dataset [35]". §5.1: "prefill requests that have
  more than 512 prompt tokens are categorized as heavy, and others are light. Decode requests with
  more than 128 tokens are categorized as heavy as ShareGPT answers' median length is 128";
  "Mixed ... is a mix of all the above workloads, randomly sampled from the ShareGPT dataset".
  The paper states NO means for these workloads (its Figure 1 is an image). So each workload here
  is this project's `sharegpt` size distribution (EcoServe Table 2 means and ranges, log-normal
  shape ASSUMED: scripts/distserve_workloads.py) conditioned on the class: light prompt =
  [16, 512], heavy prompt = [513, 3200], light output = [19, 128], heavy output = [129, 991]
  (thresholds 512 and 128 from §5.1; the outer bounds are ShareGPT's min/max from EcoServe
  Table 2). Conditioning a truncated log-normal on a sub-range is the same log-normal truncated
  to that sub-range, so the location and sigma are sharegpt's. `tetri-mixed` is `sharegpt` itself.
  The means that result are DERIVED (written into each file), not published.
  A known difference: TetriInfer says ShareGPT answers' median is 128 tokens; this project's
  `sharegpt` output (EcoServe's mean 337.99 over [19, 991], ASSUMED log-normal sigma 0.8) has a
  median near 300, so fewer outputs are light here than in TetriInfer's sample. TetriInfer ran
  OPT-13B (2,048-token context): give --max-context 2048 to clip prompt + output to it.
  (§2.2's micro-benchmarks use other sizes, 18 / 512 prompt tokens, 20-100 / >512 output tokens;
  those are not the §5.1 workloads and are not used here.)
- EcoServe (seed 003, §2 "Request settings" and Table 2 "Trace properties and experiment
  settings"), input length avg/min/max and output length avg/min/max, requests, arrival rate:
    Alpaca      19.31 / 9 / 2.47K     58.41 / 13 / 292     52K   36 req/s
    ShareGPT   161.31 / 16 / 3.2K    337.99 / 19 / 991     90K   28 req/s
    BookCorpus 1952.11 / 18 / 461K   681.2 / 32 / 1041     11K   1.2 req/s
  "the request arrival rate followed a Poisson distribution" at the Table 2 rates, which are each
  file's `mean_rps` (the default when a run gives no rate).
  ShareGPT: the existing `sharegpt` (scripts/distserve_workloads.py) already uses exactly these
  figures (mean 161.31 in [16, 3200], mean 337.99 in [19, 991]); its mean_rps stays 1.0 there.
- Alpaca: Table 2 means and ranges; log-normal shape and sigmas (input 0.5, output 0.7) ASSUMED.
- BookCorpus: EcoServe §2: "We divided the prompts in BookCorpus into 2048-token chunks", so a
  run's prompts are at most 2048 tokens (Table 2's 461K max is the raw book). ASSUMED: the chunked
  prompts keep Table 2's mean 1952.11 and min 18, and are a mixture of full 2048-token chunks and
  a remainder uniform in [18, 2048] (the last chunk of a book), the full-chunk share solved so the
  mean is 1952.11. Output: Table 2 mean 681.2 in [32, 1041], log-normal sigma 0.5 ASSUMED.
- Shape (ASSUMED) as in scripts/distserve_workloads.py: a log-normal of the stated sigma,
  truncated to [min, max], its location solved so that the mean of what workload/synthetic.py
  samples (linear interpolation between tabulated quantiles) equals the stated mean. The new
  files tabulate 256 equal steps plus a tail refined to 1 - 2^-20, so a far maximum (Alpaca's
  2.47K over a mean of 19) is reached only in the far tail instead of being spread over the top
  1/256 of the probability. Input and output lengths are independent (ASSUMED).

Run: python scripts/neighbour_workloads.py   (deterministic; no inputs)
"""

from __future__ import annotations

import json
from pathlib import Path

from distserve_workloads import interp_mean, lognormal_q, solve_mu

OUT = Path(__file__).resolve().parents[1] / "src" / "splitserve" / "workload" / "data"
N = 256
UNIFORM = [i / N for i in range(N + 1)]                     # the grid sharegpt.json uses
FINE = [i / N for i in range(N)] + [1 - 2.0 ** -k for k in range(9, 21)] + [1.0]

# ShareGPT as in scripts/distserve_workloads.py (EcoServe Table 2; sigmas ASSUMED there)
SHAREGPT = {"prompt": dict(mean=161.31, lo=16, hi=3200, sigma=1.0),
            "output": dict(mean=337.99, lo=19, hi=991, sigma=0.8)}
PROMPT_HEAVY = 512       # TetriInfer §5.1: more than 512 prompt tokens is heavy
OUTPUT_HEAVY = 128       # TetriInfer §5.1: more than 128 generated tokens is heavy
TETRI_SRC = ("TetriInfer (seed 002, paper 4) §5.1 class {cls}; ShareGPT size distribution of "
             "sharegpt.json (EcoServe Table 2 mean {mean}, range [{lo}, {hi}], log-normal sigma "
             "{sigma} ASSUMED) conditioned on [{a}, {b}]; mean DERIVED, not published")


def chunked_q(mean: float, lo: float, chunk: float, probs: list[float]) -> list[float]:
    """Remainder uniform in [lo, chunk] with probability r, a full chunk otherwise; r solved."""
    def q(r):
        return [lo + min(p / r, 1.0) * (chunk - lo) for p in probs]
    a, b = 1e-6, 1.0
    for _ in range(200):
        r = (a + b) / 2
        if interp_mean(probs, q(r)) > mean:
            a = r
        else:
            b = r
    return q((a + b) / 2)


def tetri(prompt_cls: str, output_cls: str):
    spec = {}
    for size, cls, cut in (("prompt", prompt_cls, PROMPT_HEAVY), ("output", output_cls, OUTPUT_HEAVY)):
        s = SHAREGPT[size]
        mu = solve_mu(s["mean"], s["sigma"], s["lo"], s["hi"], UNIFORM)   # sharegpt.json's location
        a, b = (s["lo"], cut) if cls == "L" else (cut + 1, s["hi"])
        spec[size] = (lognormal_q(mu, s["sigma"], a, b, FINE),
                      TETRI_SRC.format(cls=f"{prompt_cls}P{output_cls}D", a=a, b=b, **s))
    return spec


def lognormal(mean, lo, hi, sigma, src):
    return lognormal_q(solve_mu(mean, sigma, lo, hi, FINE), sigma, lo, hi, FINE), src


def specs():
    out = {}
    for p in "LH":
        for o in "LH":
            out[f"tetri-{p.lower()}p{o.lower()}d"] = dict(
                description=f"TetriInfer {p}P{o}D workload ({'light' if p == 'L' else 'heavy'} prefill, "
                            f"{'light' if o == 'L' else 'heavy'} decode; ShareGPT samples), synthetic",
                mean_rps=1.0, rps_source="ASSUMED default (TetriInfer states no arrival rate)",
                probs=FINE, **tetri(p, o))
    sp = SHAREGPT
    out["tetri-mixed"] = dict(
        description="TetriInfer Mixed workload (randomly sampled ShareGPT), synthetic; identical to sharegpt",
        mean_rps=1.0, rps_source="ASSUMED default (TetriInfer states no arrival rate)", probs=UNIFORM,
        prompt=(lognormal_q(solve_mu(**{k: sp["prompt"][k] for k in ("mean", "sigma", "lo", "hi")}, probs=UNIFORM),
                            sp["prompt"]["sigma"], sp["prompt"]["lo"], sp["prompt"]["hi"], UNIFORM),
                "TetriInfer §5.1 Mixed = random ShareGPT samples: sharegpt.json's prompt (EcoServe Table 2 "
                "mean 161.31, [16, 3200]; sigma 1.0 ASSUMED)"),
        output=(lognormal_q(solve_mu(**{k: sp["output"][k] for k in ("mean", "sigma", "lo", "hi")}, probs=UNIFORM),
                            sp["output"]["sigma"], sp["output"]["lo"], sp["output"]["hi"], UNIFORM),
                "TetriInfer §5.1 Mixed = random ShareGPT samples: sharegpt.json's output (EcoServe Table 2 "
                "mean 337.99, [19, 991]; sigma 0.8 ASSUMED)"))
    out["alpaca"] = dict(
        description="EcoServe's Alpaca trace (seed 003, Table 2), synthetic",
        mean_rps=36.0, rps_source="EcoServe Table 2 arrival rate, Alpaca: 36 req/s (Poisson, §2)", probs=FINE,
        prompt=lognormal(19.31, 9, 2470, 0.5, "mean 19.31, min 9, max 2.47K: EcoServe Table 2, Alpaca "
                                              "input length; log-normal sigma 0.5 ASSUMED"),
        output=lognormal(58.41, 13, 292, 0.7, "mean 58.41, min 13, max 292: EcoServe Table 2, Alpaca "
                                              "output length; log-normal sigma 0.7 ASSUMED"))
    out["bookcorpus"] = dict(
        description="EcoServe's BookCorpus trace (seed 003, Table 2; prompts in 2048-token chunks, §2), synthetic",
        mean_rps=1.2, rps_source="EcoServe Table 2 arrival rate, BookCorpus: 1.2 req/s (Poisson, §2)", probs=FINE,
        prompt=(chunked_q(1952.11, 18, 2048, FINE),
                "mean 1952.11, min 18: EcoServe Table 2, BookCorpus input length; max 2048: EcoServe §2 "
                "2048-token chunks (Table 2's 461K is the raw maximum); ASSUMED: the chunked prompts keep "
                "the table's mean and min, a mixture of full 2048-token chunks and a remainder uniform "
                "in [18, 2048]"),
        output=lognormal(681.2, 32, 1041, 0.5, "mean 681.2, min 32, max 1041: EcoServe Table 2, BookCorpus "
                                               "output length; log-normal sigma 0.5 ASSUMED"))
    return out


def main() -> None:
    for name, spec in specs().items():
        probs = spec["probs"]
        q = {size: spec[size][0] for size in ("prompt", "output")}
        doc = {
            "name": name,
            "source": spec["description"] + "; see scripts/neighbour_workloads.py for every number's source",
            "method": "empirical quantile function: value at each probability of `probs`, inverse-CDF "
                      "sampling with linear interpolation; sizes independent (ASSUMED)",
            "prompt_source": spec["prompt"][1],
            "output_source": spec["output"][1],
            "mean_prompt_tokens": round(interp_mean(probs, q["prompt"]), 2),
            "mean_output_tokens": round(interp_mean(probs, q["output"]), 2),
            "mean_rps": spec["mean_rps"],
            "mean_rps_source": spec["rps_source"],
            "probs": [round(p, 9) for p in probs],
            "prompt_tokens": [round(v, 3) for v in q["prompt"]],
            "output_tokens": [round(v, 3) for v in q["output"]],
        }
        path = OUT / f"{name}.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{path.name}: mean prompt {doc['mean_prompt_tokens']} in [{q['prompt'][0]:g}, "
              f"{q['prompt'][-1]:g}], mean output {doc['mean_output_tokens']} in "
              f"[{q['output'][0]:g}, {q['output'][-1]:g}]")


if __name__ == "__main__":
    main()
