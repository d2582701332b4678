"""Reading a profile CSV (the Splitwise authors' columns) and fitting it: the knots and lines of
ProfilePerfModel (profile.py has the fitted form and the reasons for it)."""

from __future__ import annotations

import csv
import os
import statistics
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from splitserve.errors import UserError

_NUMERIC = (
    "prompt_size", "batch_size", "token_size", "peak_power", "average_power",
    "prompt_time", "token_time", "e2e_time", "tensor_parallel",
)


# ----------------------------------------------------------------------------- reading


def read_profile_rows(
    path: str | os.PathLike[str],
    model: str | None = None,
    hardware: str | None = None,
    tp: int | None = None,
    unique: bool = True,
) -> list[dict[str, Any]]:
    """Rows of a profile CSV as dicts (numbers converted), filtered by model / hardware / tp.

    Exact duplicate rows are kept once (`unique` False: every row, as the file has them).
    Raises UserError for a missing file or column.
    """
    try:
        f = open(path, newline="")
    except OSError as e:
        raise UserError(f"cannot read profile {os.fspath(path)!r}: {e.strerror}") from None
    with f:
        reader = csv.DictReader(f)
        need = {"model", "hardware", *_NUMERIC}
        missing = need - set(reader.fieldnames or ())
        if missing:
            raise UserError(f"profile {os.fspath(path)!r} lacks columns: {', '.join(sorted(missing))}")
        seen: set[tuple[object, ...]] = set()
        rows: list[dict[str, Any]] = []
        for lineno, raw in enumerate(reader, start=2):
            if model is not None and raw["model"] != model:
                continue
            if hardware is not None and raw["hardware"] != hardware:
                continue
            try:
                row: dict[str, Any] = {"model": raw["model"], "hardware": raw["hardware"]}
                for k in _NUMERIC:
                    row[k] = float(raw[k])
                for k in ("prompt_size", "batch_size", "token_size", "tensor_parallel"):
                    row[k] = int(row[k])
            except (TypeError, ValueError):
                raise UserError(f"profile {os.fspath(path)!r} line {lineno}: bad number") from None
            if tp is not None and row["tensor_parallel"] != tp:
                continue
            key = tuple(row[k] for k in ("model", "hardware", *_NUMERIC))
            if unique and key in seen:
                continue
            seen.add(key)
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------- fitting helpers


def isotonic_increasing(ys: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Weighted least-squares non-decreasing fit (pool adjacent violators).

    Points that are already in order keep their values exactly.
    """
    blocks: list[tuple[float, float, int]] = []  # (value, weight, count)
    for y, w in zip(ys, weights):
        blocks.append((float(y), float(w), 1))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            w = w1 + w2
            blocks.append(((v1 * w1 + v2 * w2) / w, w, n1 + n2))
    out: list[float] = []
    for v, _, n in blocks:
        out.extend([v] * n)
    return out


def _median_knots(points: Iterable[tuple[float, float]]) -> tuple[list[float], list[float], list[int]]:
    """Group (x, y) by x; return sorted xs, median ys, group sizes."""
    groups: dict[float, list[float]] = defaultdict(list)
    for x, y in points:
        groups[x].append(y)
    xs = sorted(groups)
    return xs, [statistics.median(groups[x]) for x in xs], [len(groups[x]) for x in xs]


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear interpolation with end-segment extrapolation (no floor)."""
    n = len(xs)
    if n == 1:
        return ys[0]
    i = bisect_right(xs, x) - 1
    i = 0 if i < 0 else (n - 2 if i > n - 2 else i)
    x0, x1 = xs[i], xs[i + 1]
    return ys[i] + (ys[i + 1] - ys[i]) * (x - x0) / (x1 - x0)


def _line_fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares y = a + k x; (mean y, 0) when x does not vary."""
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx == 0.0:
        return my, 0.0
    k = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx
    return my - k * mx, k


def fit_profile(rows: Iterable[Mapping[str, Any]], attention: bool = False) -> dict[str, Any]:
    """The fitting step of ProfilePerfModel, exposed for the fit-error report.

    attention: split a prompt step's time in two terms, linear in the batched tokens plus
    `attention` seconds per squared prompt token (each prompt attends to its own tokens): the
    linear knots from the batch sweep's short prompts alone, the coefficient the median over the
    batch-1 rows of at least 4x the sweep's prompt size of (time - linear(p)) / p^2, at least 0.
    Without it (the Splitwise profile), rows of the same batched-token count are merged. With it,
    the decode step is D(b) + k(b) * (KV tokens - b * ctx_ref) instead of D(b) * g(context / b):
    D(b) the sweep's medians as measured (not made monotone), k(b) in seconds per KV token
    (ctx_slopes: [(batch, slope)]) from the batch-1 line and the rows of longer prompts at b > 1.

    Returns prompt_knots and batch_knots ([(x, seconds)], monotone), the raw medians before the
    isotonic step (prompt_raw, batch_raw: [(x, seconds, n)]), the context line (ctx_a, ctx_k in
    seconds and seconds per token, ctx_ref in tokens), the batch-1 context points
    (ctx_points: [(x, seconds)]) and a list of dropped groups.
    """
    rows = list(rows)
    if not rows:
        raise UserError("profile has no rows")
    ref_p, ref_t = _sweep_shape(rows)
    rows, dropped = _drop_broken_sweep(rows, ref_p, ref_t)
    sweep = [r for r in rows if r["prompt_size"] == ref_p and r["token_size"] == ref_t]

    # prompt: median per batched-token count, then isotonic
    prompt_rows = sweep if attention else rows
    pxs, pmed, pn = _median_knots(
        (r["batch_size"] * r["prompt_size"], r["prompt_time"] / 1e3) for r in prompt_rows
    )
    pys = isotonic_increasing(pmed, pn)
    attn = _attention(rows, pxs, pys, ref_p) if attention else 0.0

    # decode: median per batch size of the batch sweep, then isotonic (a measured machine: as
    # measured; its kernels need not be monotone in the batch)
    bxs, bmed, bn = _median_knots((r["batch_size"], r["token_time"] / 1e3) for r in sweep)
    bys = bmed if attention else isotonic_increasing(bmed, bn)

    # context factor: line through the batch-1 medians at mean decode context p + t / 2
    cxs, cmed, _ = _median_knots(
        (r["prompt_size"] + r["token_size"] / 2.0, r["token_time"] / 1e3)
        for r in rows if r["batch_size"] == 1
    )
    ctx_points = list(zip(cxs, cmed))
    ctx_a, ctx_k = _line_fit(ctx_points) if ctx_points else (1.0, 0.0)
    ctx_slopes = _ctx_slopes(rows, bxs, bys, ref_p + ref_t / 2.0, ctx_k) if attention else []

    return {
        "prompt_knots": list(zip(pxs, pys)),
        "prompt_raw": list(zip(pxs, pmed, pn)),
        "batch_knots": list(zip(bxs, bys)),
        "batch_raw": list(zip(bxs, bmed, bn)),
        "ctx_ref": ref_p + ref_t / 2.0,
        "ctx_a": ctx_a,
        "ctx_k": ctx_k,
        "ctx_points": ctx_points,
        "dropped": dropped,
        "attention": attn,
        "ctx_slopes": ctx_slopes,
    }


def _sweep_shape(rows: list[Mapping[str, Any]]) -> tuple[int, int]:
    """The batch sweep's (prompt_size, token_size): the shape most often run at batch > 1."""
    multi = [(r["prompt_size"], r["token_size"]) for r in rows if r["batch_size"] > 1]
    pool = multi or [(r["prompt_size"], r["token_size"]) for r in rows]
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for k in pool:
        counts[k] += 1
    return max(sorted(counts), key=lambda k: counts[k])


def _drop_broken_sweep(rows: list[Mapping[str, Any]], ref_p: int,
                       ref_t: int) -> tuple[list[Mapping[str, Any]], list[str]]:
    """`rows` without the batch sweep's broken groups (prompt time collapsing below half the
    previous batch size's), and a line on each group dropped."""
    by_batch: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["prompt_size"] == ref_p and r["token_size"] == ref_t:
            by_batch[r["batch_size"]].append(r)
    dropped: list[str] = []
    bad: set[int] = set()
    prev = None
    for b in sorted(by_batch):
        med = statistics.median(r["prompt_time"] for r in by_batch[b])
        if prev is not None and med < 0.5 * prev:
            bad.add(b)
            dropped.append(
                f"batch_size={b} prompt_size={ref_p} token_size={ref_t}: prompt {med:.1f} ms "
                f"after {prev:.1f} ms at the previous batch size"
            )
            continue
        prev = med
    kept = [r for r in rows
            if not (r["batch_size"] in bad and r["prompt_size"] == ref_p and r["token_size"] == ref_t)]
    return kept, dropped


def _attention(rows: list[Mapping[str, Any]], pxs: list[float], pys: list[float], ref_p: int) -> float:
    """Seconds per squared prompt token: the median over the batch-1 rows of at least 4x the
    sweep's prompt size of (time - linear(p)) / p^2, at least 0."""
    per_row = [(r["prompt_time"] / 1e3 - interpolate(pxs, pys, r["prompt_size"])) / r["prompt_size"] ** 2
               for r in rows if r["batch_size"] == 1 and r["prompt_size"] >= 4 * ref_p]
    return max(0.0, statistics.median(per_row)) if per_row else 0.0


def _ctx_slopes(rows: list[Mapping[str, Any]], bxs: list[float], bys: list[float], ref: float,
                ctx_k: float) -> list[tuple[float, float]]:
    """A decode step additive in KV tokens read: its slope per batch size, the batch-1 line's at
    batch 1 and at each larger batch the median over the rows of longer prompts than the sweep's
    (mean context `ref`) of (time - D(b)) / (KV tokens past the sweep's)."""
    per_b: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        b, x = r["batch_size"], r["prompt_size"] + r["token_size"] / 2.0
        if b > 1 and x > ref:
            per_b[b].append((r["token_time"] / 1e3 - interpolate(bxs, bys, b)) / (b * (x - ref)))
    return [(1.0, max(0.0, ctx_k))] + [(float(b), max(0.0, statistics.median(v))) for b, v in sorted(per_b.items())]
