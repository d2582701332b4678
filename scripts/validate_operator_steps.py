#!/usr/bin/env python3
"""Whole prompt and decode steps from the operator model, against the Splitwise authors' profile.

    python scripts/validate_operator_steps.py            # markdown tables (docs/perf-model.md)
    python scripts/validate_operator_steps.py --rows     # also every compared configuration

Reads `<repo root>/../shared/profiles/splitwise_a100_h100_perf_model.csv` (Splitwise authors, MIT).
Each distinct (prompt_size, batch_size, token_size) configuration of a (model, hardware, tp) is one
compared point, its measured value the median of the repeats: prompt step = `prompt_time` (all
`batch_size` prompts prefilled together), decode step = `token_time` (mean decode iteration) at
`batch_size` requests holding C = batch_size * (prompt_size + token_size / 2) KV tokens in total.
The `h100-80gb-pcap` rows (prompt times x1.3 of `h100-80gb`, not a measurement) are left out, and so
is llama2-70b tp 2 batch 64 (broken runs; docs/perf-model.md "The profile data").

Operator-model step (ms), L layers, on one tensor-parallel worker:

    step = L * (operators.layer_ms(gpu, shape, tp, tokens) + attention) + emb(tokens) + head(seqs)

- prefill attention: causal QK^T and AV of each prompt, 2 * P^2 * n_embd / tp FLOPs per layer per
  prompt of P tokens, run at the FLOP rate the fitted model gives this model's own `mlp_up_proj`
  shard at the same token count (a "measured-matmul-like" efficiency: flops / op_ms);
- decode attention: the K/V bytes of C cached tokens on one worker, C * 2 * kv_heads/tp * head_dim
  * 2 bytes per layer, read at the bandwidth the fitted model gives this model's `mlp_up_proj`
  shard at `batch` tokens (its bytes / op_ms: the weight-streaming rate of the same fit);
- head: the LM head as a GEMM of n = vocab / tp, k = n_embd over one token per sequence, priced
  with `mlp_up_proj`'s coefficients (Vidur profiles no LM head); emb: the fitted `emb` operator.
  BLOOM uses ALiBi, so its layer leaves out `attn_rope`; its MLP is not gated (GeLU).

The roofline column is `make_perf_model(model, hw, tp)` without a profile, as the simulator gets it:
`prompt_time(batch * prompt_size)` and `token_time(batch, C)`. Note that its constants were fitted on
this very profile at tp 8 (docs/perf-model.md), so its tp-8 errors are in-sample; the operator
model never saw the profile.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from splitserve.catalog import load_hardware, load_model
from splitserve.perf import make_perf_model
from splitserve.perf.operator_perf import OperatorPerfModel
from splitserve.perf.profile import read_profile_rows

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PROFILE = REPO.parent / "shared" / "profiles" / "splitwise_a100_h100_perf_model.csv"
HW = {"dgx-a100": "a100", "dgx-h100": "h100"}           # splitserve machine -> operator-model GPU
CASES = [("llama2-70b", h, tp) for tp in (8, 4, 2) for h in HW] + [("bloom-176b", h, 8) for h in HW]


def points(profile: Path, model: str, hw_name: str, tp: int) -> tuple[list, list]:
    """Prompt points (prompt, batch, ms) and decode points (prompt, batch, tokens, C, ms): medians."""
    rows = read_profile_rows(profile, model, load_hardware(hw_name).profile_name, tp)
    groups: dict[tuple, list] = defaultdict(list)
    for r in rows:
        key = (int(r["prompt_size"]), int(r["batch_size"]), int(r["token_size"]))
        if model == "llama2-70b" and tp == 2 and key[1] == 64:
            continue
        groups[key].append(r)
    pr, dec = [], []
    for (p, b, n), rs in sorted(groups.items()):
        pr.append((p, b, statistics.median(float(r["prompt_time"]) for r in rs)))
        dec.append((p, b, n, int(b * (p + n / 2)), statistics.median(float(r["token_time"]) for r in rs)))
    # the same prompt configuration appears with several token_size values: one point per (p, b)
    merged: dict[tuple, list] = defaultdict(list)
    for p, b, y in pr:
        merged[(p, b)].append(y)
    return [(p, b, statistics.median(ys)) for (p, b), ys in sorted(merged.items())], dec


def pct(pred: float, meas: float) -> float:
    return 100.0 * (pred / meas - 1.0)


def summary(errs: list[float]) -> str:
    med = statistics.median(abs(e) for e in errs)
    worst = max(errs, key=abs)
    return f"{med:.1f} | {worst:+.1f}"


def run(profile: Path, show_rows: bool) -> str:
    out = ["| model | GPU | tp | prompt pts | prompt: ops median % | ops worst % | roofline median % | roofline worst % "
           "| decode pts | decode: ops median % | ops worst % | roofline median % | roofline worst % |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    detail = []
    for model_name, hw_name, tp in CASES:
        m, hw = load_model(model_name), load_hardware(hw_name)
        pr, dec = points(profile, model_name, hw_name, tp)
        if not pr:
            out.append(f"| {model_name} | {hw_name} | {tp} | 0 | no rows in the profile | | | | | | | | |")
            continue
        ops = OperatorPerfModel(m, hw, tp)
        roof, _ = make_perf_model(m, hw, tp)
        pe_o, pe_r, de_o, de_r = [], [], [], []
        for p, b, y in pr:
            o = (ops.prompt_time(p * b) + ops.attention * b * p * p) * 1e3
            r = roof.prompt_time(p * b) * 1e3
            pe_o.append(pct(o, y))
            pe_r.append(pct(r, y))
            detail.append(f"| {model_name} | {hw_name} | {tp} | prompt | {p} | {b} | - | {y:.1f} | {o:.1f} | {pe_o[-1]:+.1f} | {r:.1f} | {pe_r[-1]:+.1f} |")
        for p, b, n, c, y in dec:
            o = ops.token_time(b, c) * 1e3
            r = roof.token_time(b, c) * 1e3
            de_o.append(pct(o, y))
            de_r.append(pct(r, y))
            detail.append(f"| {model_name} | {hw_name} | {tp} | decode | {p} | {b} | {n} | {y:.2f} | {o:.2f} | {de_o[-1]:+.1f} | {r:.2f} | {de_r[-1]:+.1f} |")
        out.append(f"| {model_name} | {HW[hw_name]} | {tp} | {len(pr)} | {summary(pe_o)} | {summary(pe_r)} "
                   f"| {len(dec)} | {summary(de_o)} | {summary(de_r)} |")
    text = "\n".join(out)
    if show_rows:
        text += ("\n\n| model | hardware | tp | step | prompt | batch | gen | measured ms | operator ms | % | roofline ms | % |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(detail))
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    ap.add_argument("--rows", action="store_true", help="also print every compared configuration")
    a = ap.parse_args(argv)
    if not a.profile.is_file():
        print(f"profile {a.profile} not found; pass --profile", file=sys.stderr)
        return 2
    print(run(a.profile, a.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
