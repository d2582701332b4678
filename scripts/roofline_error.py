#!/usr/bin/env python3
"""Error of the roofline perf model (and of the profile model's own fit) against a profile.

    python scripts/roofline_error.py            # print the tables of docs/perf-model.md
    python scripts/roofline_error.py --fit      # refit the [*.roofline] constants, print TOML

Reads `<repo root>/../shared/profiles/splitwise_a100_h100_perf_model.csv` unless --profile is
given. Compared points are the profile's medians per distinct x (the same points the profile
model is built from, broken groups dropped): prompt time per batched prompt-token count, decode
iteration time per batch size (at the batch sweep's context) and per batch-1 context.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from splitserve.catalog import RooflineCalibration, load_hardware, load_model
from splitserve.perf.profile import (
    ProfilePerfModel,
    fit_profile,
    isotonic_increasing,
    read_profile_rows,
)
from splitserve.perf.roofline import RooflinePerfModel

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PROFILE = REPO.parent / "shared" / "profiles" / "splitwise_a100_h100_perf_model.csv"
MODELS = ("llama2-70b", "bloom-176b")
HARDWARE = ("dgx-a100", "dgx-h100", "dgx-h100-cap")
TP = 8


# ----------------------------------------------------------------------------- targets


def targets(path: Path, model: str, hw_name: str, tp: int = TP) -> dict:
    hw = load_hardware(hw_name)
    rows = read_profile_rows(path, model, hw.profile_name, tp)
    fit = fit_profile(rows)
    prompt = [(x, y) for x, y, _ in fit["prompt_raw"]]
    ref = fit["ctx_ref"]
    token = [(int(b), b * ref, y) for b, y, _ in fit["batch_raw"]]
    token += [(1, x, y) for x, y in fit["ctx_points"] if x != ref]
    return {"prompt": prompt, "token": token, "fit": fit}


def errors(pm, tg: dict) -> tuple[list[float], list[float]]:
    pe = [pm.prompt_time(int(x)) / y - 1.0 for x, y in tg["prompt"]]
    te = [pm.token_time(b, int(c)) / y - 1.0 for b, c, y in tg["token"]]
    return pe, te


def mape(errs: list[float]) -> float:
    return 100.0 * sum(abs(e) for e in errs) / len(errs)


def worst(errs: list[float]) -> float:
    return 100.0 * max(errs, key=abs)


# ----------------------------------------------------------------------------- fitting


def nelder_mead(f, x0: np.ndarray, step: float = 0.3, iters: int = 4000, tol: float = 1e-12):
    """Plain Nelder-Mead minimiser (no scipy dependency)."""
    n = len(x0)
    pts = [x0.astype(float)]
    for i in range(n):
        p = x0.astype(float).copy()
        p[i] += step
        pts.append(p)
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < tol:
            break
        c = np.mean(pts[:-1], axis=0)
        xr = c + (c - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = c + 2.0 * (c - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = c + 0.5 * (pts[-1] - c)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                for i in range(1, n + 1):
                    pts[i] = pts[0] + 0.5 * (pts[i] - pts[0])
                    vals[i] = f(pts[i])
    i = int(np.argmin(vals))
    return pts[i], vals[i]


def _sq_log_err(cal: RooflineCalibration, data, phase: str) -> float:
    s = 0.0
    for model, hw, tg in data:
        pm = RooflinePerfModel(model, hw, TP, calibration=cal)
        if phase == "prompt":
            s += sum(math.log(pm.prompt_time(int(x)) / y) ** 2 for x, y in tg["prompt"])
        else:
            s += sum(math.log(pm.token_time(b, int(c)) / y) ** 2 for b, c, y in tg["token"])
    return s


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, v))))


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


# Upper bound on fitted mfu and mbu: sustained dense-GEMM and HBM-streaming efficiencies above
# ~90% are not observed in practice; without the bound the A100 decode fit drifts to mbu = 1.0
# and pushes vLLM's overheads into "perfect" bandwidth.
MAX_UTIL = 0.9


def _prompt_cal(cal: RooflineCalibration, v) -> RooflineCalibration:
    mfu = MAX_UTIL * _sigmoid(v[0])
    return replace(cal, mfu=mfu, mfu_large=mfu * _sigmoid(v[1]), mfu_knee_tokens=math.exp(v[2]),
                   prompt_layer_overhead_s=math.exp(v[3]))


def _token_cal(cal: RooflineCalibration, v) -> RooflineCalibration:
    return replace(cal, mbu=MAX_UTIL * _sigmoid(v[0]), token_layer_overhead_s=math.exp(v[1]),
                   token_seq_layer_overhead_s=math.exp(v[2]))


def fit_hardware(path: Path, hw_name: str) -> RooflineCalibration:
    """Fit the prompt constants (mfu, mfu_large, mfu_knee_tokens, prompt overhead) to the prompt
    points and the decode constants (mbu, token overheads) to the token points of all MODELS at
    TP on one uncapped hardware, minimising the squared log error, from a few starts; the two
    phases share mfu and mbu only weakly, so two alternations settle them."""
    hw = load_hardware(hw_name)
    data = [(load_model(m), hw, targets(path, m, hw_name)) for m in MODELS]
    cal = RooflineCalibration(
        mfu=0.5, mfu_large=0.3, mfu_knee_tokens=2000.0, mbu=0.8,
        prompt_layer_overhead_s=5e-4, token_layer_overhead_s=4e-4,
        token_seq_layer_overhead_s=5e-6, prompt_cap_slowdown=1.0,
    )
    for _ in range(2):
        best = None
        for v0 in ([0.0, 0.0, 7.6, -7.6], [1.0, 0.5, 7.0, -7.0], [-1.0, -1.0, 9.0, -9.0]):
            v, val = nelder_mead(lambda v, c=cal: _sq_log_err(_prompt_cal(c, v), data, "prompt"),
                                 np.array(v0))
            if best is None or val < best[1]:
                best = (v, val)
        cal = _prompt_cal(cal, best[0])
        best = None
        for v0 in ([1.0, -7.8, -12.0], [0.0, -8.5, -11.0]):
            v, val = nelder_mead(lambda v, c=cal: _sq_log_err(_token_cal(c, v), data, "token"),
                                 np.array(v0))
            if best is None or val < best[1]:
                best = (v, val)
        cal = _token_cal(cal, best[0])
    return cal


def cap_slowdown(path: Path, capped: str, uncapped: str) -> float:
    """Median ratio of capped to uncapped prompt time over all matching profile points."""
    ratios = []
    for m in MODELS:
        a = dict(targets(path, m, uncapped)["prompt"])
        b = dict(targets(path, m, capped)["prompt"])
        ratios += [b[x] / a[x] for x in a if x in b]
    return statistics.median(ratios)


def print_fit(path: Path) -> None:
    for hw_name in ("dgx-a100", "dgx-h100"):
        cal = fit_hardware(path, hw_name)
        print(f"[{hw_name}.roofline]")
        for k, v in asdict(cal).items():
            print(f"{k} = {v:.6g}")
        print()
    print(f"dgx-h100-cap prompt_cap_slowdown = {cap_slowdown(path, 'dgx-h100-cap', 'dgx-h100'):.6g}")


# ----------------------------------------------------------------------------- report


def roofline_table(path: Path) -> list[str]:
    out = [
        "| model | hardware | prompt MAPE | prompt worst | token MAPE | token worst | points (prompt/token) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for m in MODELS:
        for h in HARDWARE:
            tg = targets(path, m, h)
            pm = RooflinePerfModel(load_model(m), load_hardware(h), TP)
            pe, te = errors(pm, tg)
            out.append(
                f"| {m} | {h} | {mape(pe):.1f}% | {worst(pe):+.1f}% | {mape(te):.1f}% | "
                f"{worst(te):+.1f}% | {len(pe)}/{len(te)} |"
            )
    return out


def _loo_polyline(xs: list[float], ys: list[float], ns: list[int]) -> list[float]:
    """Leave each interior knot out, refit (isotonic + polyline) and predict it."""
    errs = []
    for i in range(1, len(xs) - 1):
        kx = xs[:i] + xs[i + 1:]
        ky = isotonic_increasing(ys[:i] + ys[i + 1:], ns[:i] + ns[i + 1:])
        j = i - 1
        pred = ky[j] + (ky[j + 1] - ky[j]) * (xs[i] - kx[j]) / (kx[j + 1] - kx[j])
        errs.append(pred / ys[i] - 1.0)
    return errs


def _loo_line(points: list[tuple[float, float]]) -> list[float]:
    errs = []
    for i in range(len(points)):
        rest = points[:i] + points[i + 1:]
        xs = np.array([p[0] for p in rest])
        ys = np.array([p[1] for p in rest])
        k, a = np.polyfit(xs, ys, 1)
        k = max(k, 0.0)
        if k == 0.0:
            a = ys.mean()
        errs.append((a + k * points[i][0]) / points[i][1] - 1.0)
    return errs


def _repeat_noise(path: Path, model: str, hw_name: str) -> tuple[float, float]:
    """MAPE of single repeats against their group median (the measurement noise floor)."""
    rows = read_profile_rows(path, model, load_hardware(hw_name).profile_name, TP)
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["prompt_size"], r["batch_size"], r["token_size"]), []).append(r)
    pe, te = [], []
    for g in groups.values():
        mp = statistics.median(r["prompt_time"] for r in g)
        mt = statistics.median(r["token_time"] for r in g)
        pe += [r["prompt_time"] / mp - 1.0 for r in g]
        te += [r["token_time"] / mt - 1.0 for r in g]
    return mape(pe), mape(te)


def _split_errors(path: Path, model: str, hw_name: str, reps: int = 50, seed: int = 0):
    """Errors of ProfilePerfModel on held-out rows over `reps` random 80:20 row splits (the
    paper's validation, Sec. V-B). Rows of groups the fit drops as broken are not scored."""
    rows = read_profile_rows(path, model, load_hardware(hw_name).profile_name, TP)
    broken = {d.split(":")[0] for d in fit_profile(rows)["dropped"]}

    def is_broken(r) -> bool:
        return (f"batch_size={r['batch_size']} prompt_size={r['prompt_size']} "
                f"token_size={r['token_size']}") in broken

    rng = np.random.default_rng(seed)
    pe, te = [], []
    for _ in range(reps):
        idx = rng.permutation(len(rows))
        cut = int(round(0.8 * len(rows)))
        train = [rows[i] for i in idx[:cut]]
        pm = ProfilePerfModel.from_rows(train)
        for i in idx[cut:]:
            r = rows[i]
            if is_broken(r):
                continue
            b, p, t = r["batch_size"], r["prompt_size"], r["token_size"]
            pe.append(pm.prompt_time(b * p) / (r["prompt_time"] / 1e3) - 1.0)
            te.append(pm.token_time(b, int(b * (p + t / 2))) / (r["token_time"] / 1e3) - 1.0)
    return pe, te


def profile_loo_table(path: Path) -> list[str]:
    out = [
        "| model | hardware | 80:20 prompt MAPE | 80:20 token MAPE | prompt LOO MAPE (worst) | "
        "decode-batch LOO MAPE (worst) | context-line LOO MAPE | repeat noise prompt / token |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m in MODELS:
        for h in HARDWARE:
            fit = targets(path, m, h)["fit"]
            px, py, pn = (list(t) for t in zip(*fit["prompt_raw"]))
            bx, by, bn = (list(t) for t in zip(*fit["batch_raw"]))
            pe = _loo_polyline(px, py, pn)
            be = _loo_polyline(bx, by, bn)
            ce = _loo_line(fit["ctx_points"])
            np_, nt = _repeat_noise(path, m, h)
            spe, ste = _split_errors(path, m, h)
            out.append(
                f"| {m} | {h} | {mape(spe):.1f}% | {mape(ste):.1f}% | {mape(pe):.1f}% "
                f"({worst(pe):+.1f}%) | {mape(be):.1f}% ({worst(be):+.1f}%) | {mape(ce):.1f}% | "
                f"{np_:.1f}% / {nt:.1f}% |"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    ap.add_argument("--fit", action="store_true", help="refit the roofline constants")
    args = ap.parse_args(argv)
    if not args.profile.exists():
        print(f"profile not found: {args.profile}", file=sys.stderr)
        return 2
    if args.fit:
        print_fit(args.profile)
        return 0
    print(f"Roofline vs profile, tp {TP} ({args.profile.name})\n")
    print("\n".join(roofline_table(args.profile)))
    print(f"\nProfile model's own fit error on held-out points, tp {TP}\n")
    print("\n".join(profile_loo_table(args.profile)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
