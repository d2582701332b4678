#!/usr/bin/env python3
"""Fit what a measured step costs beyond its operators: the per-step overhead O, the prefill
slowdown S(T) and the per-request decode cost of perf/operator_perf.py, per GPU, on the Splitwise
authors' llama2-70b steps at tp 2, 4 and 8; writes src/splitserve/perf/data/step_overheads.json.

    python scripts/fit_step_overheads.py            # fit, write, print the coefficients
    python scripts/fit_step_overheads.py --check    # fit and compare with the committed file

Reads `<repo root>/../shared/profiles/splitwise_a100_h100_perf_model.csv` (Splitwise authors, MIT).
BLOOM-176B's rows are left out of the fit (scripts/validate_operator_steps.py tests on them).
Points are scripts/validate_operator_steps.py's: medians of each configuration's repeats, the
pcap rows and llama2-70b tp 2 batch 64 left out. With the operator model alone (every step
coefficient 0) as `ops`:

1. O = L (o_layer + o_ar (tp - 1)): least squares over every decode point of batch 1 of
   measured - ops (the decode step of one request is the operator sum plus this overhead);
2. o_seq: the median over decode points of batch 2-32 of (measured - ops - O) / (L b);
3. S: for each knee on a grid, s0 and s1 by least squares of (measured - O) / ops - 1 on
   s0 u + s1 log2(tp) u, u = T / (T + knee), over every prompt point; the knee with the least
   squared error wins. s(tp) = max(0, s0 + s1 log2 tp) extrapolates to tp 1, which no profile row
   has (docs/perf-model.md: the papers' printed tp-1 latencies check it).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

from splitserve.catalog import load_hardware, load_model
from splitserve.perf.operator_perf import OperatorPerfModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validate_operator_steps import DEFAULT_PROFILE, points  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "splitserve" / "perf" / "data" / "step_overheads.json"
MACHINES = {"a100": "dgx-a100", "h100": "dgx-h100"}
ZERO = {"o_layer": 0.0, "o_ar": 0.0, "s0": 0.0, "s1": 0.0, "knee": 1.0, "o_seq": 0.0}
TPS = (2, 4, 8)
MODEL = "llama2-70b"


def fit_gpu(profile: Path, gpu: str) -> dict:
    m, hw = load_model(MODEL), load_hardware(MACHINES[gpu])
    L = m.layers
    data = {tp: (points(profile, MODEL, hw.name, tp), OperatorPerfModel(m, hw, tp, step=ZERO)) for tp in TPS}
    # 1. the per-step overhead from batch-1 decodes
    X, y = [], []
    for tp, ((_, dec), ops) in data.items():
        for p, b, n, c, meas in dec:
            if b == 1:
                X.append([L, L * (tp - 1)])
                y.append(meas * 1e-3 - ops.token_time(1, c))
    (o_layer, o_ar), *_ = np.linalg.lstsq(np.array(X), np.array(y), rcond=None)
    overhead = {tp: L * (o_layer + o_ar * (tp - 1)) for tp in TPS}
    # 2. per request of a decode batch
    per = [(meas * 1e-3 - ops.token_time(b, c) - overhead[tp]) / (L * b)
           for tp, ((_, dec), ops) in data.items() for p, b, n, c, meas in dec if 2 <= b <= 32]
    o_seq = max(0.0, statistics.median(per))
    # 3. the prefill slowdown
    pts = [(tp, p * b, (meas * 1e-3 - overhead[tp]) / ops.prompt_time(p * b) - 1.0)
           for tp, ((pr, _), ops) in data.items() for p, b, meas in pr]
    best = None
    for knee in np.geomspace(100.0, 50000.0, 120):
        A = np.array([[t / (t + knee), math.log2(tp) * t / (t + knee)] for tp, t, _ in pts])
        r = np.array([v for *_, v in pts])
        coef, *_ = np.linalg.lstsq(A, r, rcond=None)
        err = float(np.sum((A @ coef - r) ** 2))
        if best is None or err < best[0]:
            best = (err, float(knee), coef)
    _, knee, (s0, s1) = best
    return {"o_layer": float(o_layer), "o_ar": float(o_ar), "s0": float(s0), "s1": float(s1),
            "knee": round(knee, 1), "o_seq": float(o_seq)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    ap.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    a = ap.parse_args(argv)
    if not a.profile.is_file():
        print(f"profile {a.profile} not found; pass --profile", file=sys.stderr)
        return 2
    data = json.loads(OUT.read_text())
    fitted = {gpu: fit_gpu(a.profile, gpu) for gpu in MACHINES}
    for gpu, c in fitted.items():
        print(f"{gpu}: O = L ({c['o_layer'] * 1e3:.4f} + {c['o_ar'] * 1e3:.4f} (tp - 1)) ms; "
              f"o_seq {c['o_seq'] * 1e6:.2f} us/layer/request; "
              f"S(T) = 1 + max(0, {c['s0']:.3f} + {c['s1']:.3f} log2 tp) T / (T + {c['knee']:.0f})")
    if a.check:
        same = all(math.isclose(fitted[g][k], data["gpus"][g][k], rel_tol=1e-6, abs_tol=1e-12)
                   for g in fitted for k in fitted[g])
        print("the committed coefficients are this fit" if same else "the committed coefficients DIFFER from this fit")
        return 0 if same else 1
    data["source"] = ("Splitwise authors' profile (splitwise_a100_h100_perf_model.csv, MIT), llama2-70b tp 2/4/8; "
                      "fitted by scripts/fit_step_overheads.py")
    data["units"] = "o_layer, o_ar, o_seq: s per layer; s0, s1: dimensionless; knee: prompt tokens"
    data["gpus"] = fitted
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
