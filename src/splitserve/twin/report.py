"""Live run against its simulated twin: a side-by-side table, `report.md` and `cdf.png`.

Both runs are `summary.json` dicts with the same names (docs/architecture.md, "summary.json"):
live from `splitserve bench` (bench/summary.py), simulated from `splitserve simulate`
(report/summary.py). A live summary lacks `queue_s`, `kv_transfer` and the cluster's
preemptions and borrowed machines; their rows show live as missing and no error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

METRICS = ("ttft", "tbt", "e2e", "queue")  # the summary keys are f"{m}_s"
PERCENTILES = ("p50", "p90", "p99")
BOUNDED = ("ttft", "tbt", "e2e")           # the metrics the percentile bounds apply to
DEFAULT_BOUNDS = {"p50": 0.10, "p90": 0.20}
CDF_METRICS = ("ttft", "tbt", "e2e")
_LABELS = {"ttft": "TTFT", "tbt": "TBT", "e2e": "E2E", "queue": "queue"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One line of the side-by-side table."""
    metric: str                  # e.g. "TTFT P50 (s)", "throughput (req/s)", "preemptions"
    live: float | None
    sim: float | None
    rel_error: float | None      # (sim - live) / live; None when live is 0 or either is missing
    bound: float | None = None   # the accuracy bound on |rel_error|, if any
    ok: bool | None = None       # |rel_error| <= bound; None without a bound or an error


def _get(summary: dict, *path: str) -> float | None:
    """The number at `path` in `summary`, or None where a key is absent or the value is null/NaN."""
    x = summary
    for key in path:
        if not isinstance(x, dict) or key not in x:
            return None
        x = x[key]
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


def _row(metric: str, live: float | None, sim: float | None, bound: float | None) -> Row:
    err = None if live is None or sim is None or live == 0 else (sim - live) / live
    ok = None if err is None or bound is None else abs(err) <= bound
    return Row(metric=metric, live=live, sim=sim, rel_error=err, bound=bound, ok=ok)


def compare(live: dict, sim: dict, bounds: dict[str, float] | None = None) -> list[Row]:
    """Rows for P50/P90/P99 of ttft, tbt, e2e, queue; throughput; completed; failed; the
    cluster's preemptions and borrowed machines; P50/P90/P99 of the visible KV transfer time.

    `bounds` maps a percentile ("p50", "p90", "p99") to the largest allowed |rel_error| of that
    percentile of ttft, tbt and e2e (default `DEFAULT_BOUNDS`; it replaces, not extends, them).
    A row is listed when at least one summary carries the metric.
    """
    bounds = DEFAULT_BOUNDS if bounds is None else bounds
    specs: list[tuple[str, tuple[str, ...], float | None]] = []
    for m in METRICS:
        for p in PERCENTILES:
            specs.append((f"{_LABELS[m]} {p.upper()} (s)", (f"{m}_s", p),
                          bounds.get(p) if m in BOUNDED else None))
    specs += [("throughput (req/s)", ("throughput_rps",), None),
              ("completed", ("completed",), None),
              ("failed", ("failed",), None),
              ("preemptions", ("cluster", "preemptions"), None),
              ("borrowed machines", ("cluster", "borrowed_into_mixed_pool"), None)]
    specs += [(f"KV transfer {p.upper()} (s)", ("kv_transfer", "visible_s", p), None)
              for p in PERCENTILES]
    specs += [("requests", ("requests",), None),          # conversations: turns follow replies
              ("prefix-cache hit rate", ("prefix_cache", "hit_rate"), None)]
    rows = []
    for metric, path, bound in specs:
        lv, sv = _get(live, *path), _get(sim, *path)
        if lv is not None or sv is not None:
            rows.append(_row(metric, lv, sv, bound))
    return rows


def samples_from_requests_jsonl(path: str | Path) -> dict[str, list[float]]:
    """Per-request samples {"ttft", "tbt", "e2e"} (seconds) from bench's `requests.jsonl`.

    Only `outcome == "completed"` lines count (the population of bench's histograms). The file
    keeps no token times, so TBT is each request's mean gap (e2e - ttft) / (tokens - 1), repeated
    tokens - 1 times: one sample per gap, weighted like bench's every-gap TBT (same count and,
    up to the last token -> [DONE] delay that e2e includes, the same mean; its tails are
    narrower, since a request's gaps are averaged). Requests with one token add no TBT sample.
    """
    out: dict[str, list[float]] = {"ttft": [], "tbt": [], "e2e": []}
    with Path(path).open() as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("outcome") != "completed":
                continue
            ttft, e2e, tokens = float(rec["ttft"]), float(rec["e2e"]), int(rec["tokens"])
            out["ttft"].append(ttft)
            out["e2e"].append(e2e)
            if tokens > 1:
                out["tbt"].extend([(e2e - ttft) / (tokens - 1)] * (tokens - 1))
    return out


def _num(x: float | None) -> str:
    if x is None:
        return "n/a"
    if x.is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:.4g}"


def _pct(err: float | None) -> str:
    if err is None:
        return "n/a"
    pct = err * 100
    return f"{pct:+,.0f}%" if abs(pct) >= 100 else f"{pct:+.1f}%"


def _cells(r: Row) -> list[str]:
    return [r.metric, _num(r.live), _num(r.sim),
            _pct(r.rel_error),
            "" if r.bound is None else f"±{r.bound * 100:g}%",
            "" if r.ok is None else ("yes" if r.ok else "NO")]


_HEADER = ["metric", "live", "simulated", "error", "bound", "ok"]


def _markdown_table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(_HEADER) + " |", "|---|" + "---:|" * 4 + ":---:|"]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def table_text(rows: list[Row]) -> str:
    """The side-by-side table as aligned plain text (metric left-aligned, the rest right)."""
    table = [_HEADER] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(_HEADER))]

    def fmt(line: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(line, widths))).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(table[0]), rule] + [fmt(line) for line in table[1:]])


def _write_cdf(path: Path, live: dict[str, list[float]], sim: dict[str, list[float]]) -> bool:
    """One subplot per metric of CDF_METRICS with samples: the empirical CDFs overlaid."""
    metrics = [m for m in CDF_METRICS if live.get(m) or sim.get(m)]
    if not metrics:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.6), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        positive = []
        for name, samples, style in (("live", live, "-"), ("simulated", sim, "--")):
            x = np.sort(np.asarray(samples.get(m) or [], dtype=float))
            if x.size:
                ax.step(np.r_[x[0], x], np.arange(x.size + 1) / x.size, style, where="post",
                        label=f"{name} (n={x.size:,})")
                positive.append(x[x > 0])
        pos = np.concatenate(positive) if positive else np.empty(0)
        if pos.size and pos.max() / pos.min() > 100:   # spans more than 2 decades
            ax.set_xscale("log")
        ax.set_xlabel(f"{_LABELS[m]} (s)")
        ax.set_ylabel("fraction of samples ≤ x")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


ABLATED = ("TTFT P50 (s)", "TTFT P90 (s)", "TBT P50 (s)", "TBT P90 (s)", "E2E P50 (s)", "E2E P90 (s)", "preemptions")


def ablation_markdown(rows: list[Row], without: dict[str, list[Row]]) -> str:
    """The P50/P90 errors of the model and of its variants (`without`: a row label, e.g. "without
    corun", -> that simulation's compare() rows); a term that matters moves them."""
    def cells(rs: list[Row]) -> list[str]:
        by = {r.metric: r for r in rs}
        return [f"{by[m].rel_error:+.0%}" + ("" if by[m].ok is not False else " ✗")
                if m in by and by[m].rel_error is not None else "-" for m in ABLATED]
    table = [["model"] + [m.replace(" (s)", "") for m in ABLATED], ["as measured"] + cells(rows)]
    table += [[label] + cells(rs) for label, rs in without.items()]
    table.insert(1, ["---"] * len(table[0]))
    return "\n".join("| " + " | ".join(line) + " |" for line in table)


def write_report(out_dir: str | Path, rows: list[Row], *, title: str, meta: dict[str, str],
                 live_samples: dict[str, list[float]] | None = None,
                 sim_samples: dict[str, list[float]] | None = None, steps: str = "",
                 ablation: str = "") -> Path:
    """Write `out_dir/report.md` (title, "how measured" from `meta`, the table, then the
    markdown `steps`: the engine steps' table, steps.py) and, when samples are given for any of
    ttft/tbt/e2e, `out_dir/cdf.png` (linked from the report). Returns the report's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = [f"# {title}", "", "## How measured", ""]
    parts += [f"- **{k}**: {v}" for k, v in meta.items()]
    parts += ["", "## Live vs simulated", "",
              "error = (simulated - live) / live; ok = |error| ≤ bound.", "",
              _markdown_table(rows), ""]
    if ablation:
        parts += ["## Each modelled term taken out", "",
                  "The same simulation with one term of the measured machine removed (twin/machine.py "
                  "`MachineProfile.without`): corun, the slowdown of a worker next to busy ones; "
                  "kv_transfer, the KV link's time; path, the serving path's overheads and CPU. The last "
                  "row gives the model the host's speed during the run, that of the live steps no other "
                  "worker computed beside (from the step log, after the fact: it explains, it does not "
                  "predict). Errors against the live run; "
                  "✗ outside the bound.", "", ablation, ""]
    if steps:
        parts += ["## Engine steps, live vs model", "",
                  "Each live worker's engine steps (`serve --step-log`) against the time the simulator "
                  "gives a step of the same shape (perf model, co-run slowdown for the part of the step "
                  "during which another worker computed, step overhead). Alone: no other worker computed "
                  "during the step; shared: another computed through all of it.", "", steps, ""]
    if (live_samples or sim_samples) and _write_cdf(out / "cdf.png", live_samples or {},
                                                    sim_samples or {}):
        parts += ["## Latency distributions", "", "![empirical CDFs, live vs simulated](cdf.png)", ""]
    path = out / "report.md"
    path.write_text("\n".join(parts))
    return path
