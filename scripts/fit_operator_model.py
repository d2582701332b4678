"""Fit splitserve's operator model (src/splitserve/perf/operators.py) on Vidur's GPU profiles.

Reads ../shared/profiles/vidur/ (microsoft/vidur commit 7d47513, MIT): compute/{a100,h100}/**/mlp.csv
(operator medians in ms by model shape, TP degree and token count) and network/{gpu}_dgx/all_reduce.csv
(ms by fp16 element count and worker count, one node). Fits, per GPU, non-negative coefficients of
each operator's features by least squares on relative error, and all-reduce latency + per-byte time
per worker count; writes src/splitserve/perf/data/operator_model.json.

    python scripts/fit_operator_model.py              # fit and write the JSON
    python scripts/fit_operator_model.py --validate   # also leave-one-model-out tables (markdown)
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from splitserve.perf.operators import ALL_OPS, LAYER_OPS, LayerShape, OperatorModel, features

ROOT = Path(__file__).resolve().parents[1]
VIDUR = ROOT.parent / "shared" / "profiles" / "vidur"
OUT = ROOT / "src" / "splitserve" / "perf" / "data" / "operator_model.json"
SMS = {"a100": 108, "h100": 132}
WORKERS = (2, 4, 8)


def load_rows(vidur: Path, gpu: str) -> list[dict]:
    """One dict per profiled (model, tp, tokens): model, shape, tp, tokens, ms {op: median}."""
    rows = []
    for path in sorted((vidur / "compute" / gpu).glob("*/*/mlp.csv")):
        model = path.parent.name
        with path.open() as f:
            for r in csv.DictReader(f):
                shape = LayerShape(
                    int(r["n_head"]), int(r["n_kv_head"]), int(r["n_embd"]),
                    int(r["n_expanded_embd"]), r["use_gated_mlp"].strip().lower() == "true",
                    "time_stats.post_attention_layernorm.median" in r,
                )
                ms = {op: float(r[f"time_stats.{op}.median"]) for op in ALL_OPS if f"time_stats.{op}.median" in r}
                rows.append({"model": model, "shape": shape, "tp": int(r["num_tensor_parallel_workers"]),
                             "tokens": int(r["num_tokens"]), "ms": ms})
    return rows


def nn_rel_lstsq(x: np.ndarray, y: np.ndarray) -> list[float]:
    """Non-negative least squares on relative error (rows scaled by 1/y), by dropping negatives."""
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    xs, ys = x / y[:, None], np.ones_like(y)
    while active:
        sol, *_ = np.linalg.lstsq(xs[:, active], ys, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active = [a for a, v in zip(active, sol) if v >= 0] if (sol >= 0).any() else []
    return [float(c) for c in coef]


def fit_ops(rows: list[dict], sms: int) -> dict[str, list[float]]:
    out = {}
    for op in ALL_OPS:
        sel = [r for r in rows if op in r["ms"]]
        x = np.array([features(op, r["shape"], r["tp"], r["tokens"], sms) for r in sel])
        y = np.array([r["ms"][op] for r in sel])
        keep = y > 0
        out[op] = nn_rel_lstsq(x[keep], y[keep])
    return out


def load_all_reduce(vidur: Path, gpu: str) -> dict[int, list[tuple[int, float]]]:
    """(elements, ms) per worker count, single-node rows (devices_per_node == num_workers)."""
    pts: dict[int, list[tuple[int, float]]] = {w: [] for w in WORKERS}
    with (vidur / "network" / f"{gpu}_dgx" / "all_reduce.csv").open() as f:
        for r in csv.DictReader(f):
            w = int(r["num_workers"])
            if w in pts and int(r["devices_per_node"]) == w:
                pts[w].append((int(r["size"]), float(r["time_stats.all_reduce.median"])))
    return pts


def fit_all_reduce(pts: dict[int, list[tuple[int, float]]]) -> dict[str, list[float]]:
    out = {}
    for w, p in pts.items():
        x = np.array([[1.0, 2.0 * e] for e, _ in p])
        y = np.array([t for _, t in p])
        out[str(w)] = nn_rel_lstsq(x, y)
    return out


def fit(vidur: Path) -> dict:
    gpus = {}
    for gpu, sms in SMS.items():
        rows = load_rows(vidur, gpu)
        gpus[gpu] = {"sms": sms, "ops": fit_ops(rows, sms), "all_reduce": fit_all_reduce(load_all_reduce(vidur, gpu))}
    return {
        "source": "Vidur (Agrawal et al., MLSys 2024) data/profiling, microsoft/vidur commit 7d47513, MIT; "
                  "fitted by scripts/fit_operator_model.py",
        "units": "ms; op features in splitserve/perf/operators.py features(); all_reduce [latency_ms, ms_per_byte]",
        "gpus": gpus,
    }


def pct(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas * 100.0


def lomo(vidur: Path, gpu: str, only: str | None = None) -> list[dict]:
    """Held-out predictions: for each model (or `only`), fit on the others and predict its rows."""
    rows = load_rows(vidur, gpu)
    out = []
    for held in sorted({r["model"] for r in rows} if only is None else {only}):
        train = [r for r in rows if r["model"] != held]
        coefs = {"sms": SMS[gpu], "ops": fit_ops(train, SMS[gpu]), "all_reduce": {}}
        m = OperatorModel.from_dict({"gpus": {gpu: coefs}})
        for r in (r for r in rows if r["model"] == held):
            ops = {op: m.op_ms(gpu, op, r["shape"], r["tp"], r["tokens"]) for op in r["shape"].layer_ops()}
            meas_layer = sum(r["ms"][op] for op in ops)
            out.append({**r, "pred": ops, "layer_err": pct(sum(ops.values()), meas_layer),
                        "op_err": {op: pct(ops[op], r["ms"][op]) for op in ops if r["ms"][op] > 0}})
    return out


def validate(vidur: Path, data: dict) -> str:
    lines = ["| GPU | TP | rows | whole layer: median % | worst % (where) | every operator: median % | worst % (where) |",
             "|---|---|---|---|---|---|---|"]
    per_op = ["| GPU | operator | median % | p90 % | worst % (where) |", "|---|---|---|---|---|"]
    per_model = ["| GPU | held-out model | whole layer: median % | worst % (tp, tokens) |", "|---|---|---|---|"]
    heads = []
    for gpu in SMS:
        res = lomo(vidur, gpu)
        for model in sorted({r["model"] for r in res}):
            sel = [r for r in res if r["model"] == model]
            w = max(sel, key=lambda r: r["layer_err"])
            per_model.append(f"| {gpu} | {model} | {statistics.median(r['layer_err'] for r in sel):.1f} "
                             f"| {w['layer_err']:.1f} (tp {w['tp']}, {w['tokens']} tok) |")
        for tp in sorted({r["tp"] for r in res}) + [0]:
            sel = [r for r in res if tp == 0 or r["tp"] == tp]
            worst = max(sel, key=lambda r: r["layer_err"])
            ops = [(e, op, r) for r in sel for op, e in r["op_err"].items()]
            wop = max(ops, key=lambda t: t[0])
            lmed = statistics.median(r["layer_err"] for r in sel)
            lines.append(
                f"| {gpu} | {tp or 'all'} | {len(sel)} | {lmed:.1f} | {worst['layer_err']:.1f} "
                f"({worst['model']}, tp {worst['tp']}, {worst['tokens']} tok) | {statistics.median(e for e, _, _ in ops):.1f} "
                f"| {wop[0]:.0f} ({wop[1]}, {wop[2]['model']}, tp {wop[2]['tp']}, {wop[2]['tokens']} tok) |")
            if tp == 0:
                heads.append(f"{gpu}: whole layer median {lmed:.1f}%, worst {worst['layer_err']:.1f}%")
        for op in LAYER_OPS:
            errs = [(r["op_err"][op], r) for r in res if op in r["op_err"]]
            vals = sorted(e for e, _ in errs)
            e, r = max(errs, key=lambda t: t[0])
            per_op.append(f"| {gpu} | {op} | {statistics.median(vals):.1f} | {vals[int(0.9 * (len(vals) - 1))]:.1f} "
                          f"| {e:.0f} ({r['model']}, tp {r['tp']}, {r['tokens']} tok) |")
    ar = ["| GPU | workers | latency (us) | bus bytes/s (GB/s, 2(n-1)/n) | median % | worst % (size) |", "|---|---|---|---|---|---|"]
    m = OperatorModel.from_dict(data)
    for gpu in SMS:
        for w, p in load_all_reduce(vidur, gpu).items():
            errs = [(pct(m.all_reduce_ms(gpu, w, e), t), e) for e, t in p]
            lat, per_byte = data["gpus"][gpu]["all_reduce"][str(w)]
            bus = (2 * (w - 1) / w) / (per_byte * 1e-3) / 1e9 if per_byte > 0 else float("inf")
            we = max(errs, key=lambda t: t[0])
            ar.append(f"| {gpu} | {w} | {lat * 1e3:.1f} | {bus:.0f} | {statistics.median(e for e, _ in errs):.1f} | {we[0]:.0f} ({we[1]}) |")
    return "\n".join(["Headline: " + "; ".join(heads), "", *lines, "", *per_model, "", *per_op, "", *ar])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vidur", type=Path, default=VIDUR, help="Vidur profiles folder")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--validate", action="store_true", help="print leave-one-model-out tables")
    a = ap.parse_args(argv)
    if not (a.vidur / "compute").is_dir():
        print(f"no Vidur profiles at {a.vidur}; pass --vidur", file=sys.stderr)
        return 2
    data = fit(a.vidur)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {a.out}")
    if a.validate:
        print(validate(a.vidur, data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
