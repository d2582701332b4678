"""PNG plots of the reproduction (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..report.slo import SLO  # noqa: E402

METRICS = (("ttft", "TTFT"), ("tbt", "TBT"), ("e2e", "E2E"))


def heatmap(data: dict, path: Path, paper_best: tuple[int, int]) -> None:
    ps, ts, cells = data["prompt"], data["token"], data["cells"]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7.5), constrained_layout=True)
    for row, q in enumerate(("p50", "p99")):
        for col, (m, label) in enumerate(METRICS):
            ax = axes[row, col]
            z = np.array([[cells[(p, t)][f"{m}_{q}"] * 1e3 for p in ps] for t in ts])
            im = ax.imshow(np.log10(z), origin="lower", aspect="auto", cmap="viridis")
            ax.set_xticks(range(len(ps)), ps, fontsize=7)
            ax.set_yticks(range(len(ts)), ts, fontsize=7)
            ax.set_xlabel("prompt machines")
            ax.set_ylabel("token machines")
            ax.set_title(f"{q.upper()} {label} (ms, log10 colour)")
            for i, t in enumerate(ts):
                for j, p in enumerate(ps):
                    c = cells[(p, t)]
                    ax.text(j, i, f"{z[i, j]:.0f}", ha="center", va="center", fontsize=6,
                            color="white" if c["slo_met"] else "#ff8080")
            if data["best"]:
                bp, bt = data["best"]
                ax.plot(ps.index(bp), ts.index(bt), marker="*", color="red", markersize=16,
                        markeredgecolor="white")
            fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(f"Splitwise-HH, Llama2-70B, coding at {data['rps']:g} req/s: white numbers meet all "
                 f"nine SLOs, red ones do not; star: cheapest that meets them "
                 f"(paper: {paper_best[0]}P, {paper_best[1]}T)")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_curves(sweep: dict, path: Path, title: str) -> None:
    slo = SLO()
    fig, axes = plt.subplots(3, 3, figsize=(13, 10), constrained_layout=True, sharex=True)
    for row, (m, label) in enumerate(METRICS):
        limits = getattr(slo, m)
        for col, q in enumerate(("p50", "p90", "p99")):
            ax = axes[row, col]
            for design, points in sweep.items():
                ax.plot([x["rps"] for x in points], [x[f"{m}_{q}"] for x in points], marker="o",
                        markersize=3, label=design)
            ax.axhline(limits[col], color="red", linestyle="--", linewidth=1)
            ax.set_yscale("log")
            ax.set_title(f"{q.upper()} {label} slowdown")
            if row == 2:
                ax.set_xlabel("load (req/s)")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(title + " (dashed: SLO)")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bars(rows: list[tuple[str, dict[str, float]]], path: Path, title: str) -> None:
    """Grouped bars: one group per design, one bar per quantity (already normalised)."""
    names = [r[0] for r in rows]
    keys = list(rows[0][1]) if rows else []
    x = np.arange(len(names))
    w = 0.8 / max(len(keys), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names)), 4), constrained_layout=True)
    for i, k in enumerate(keys):
        ax.bar(x + i * w, [r[1][k] for r in rows], w, label=k)
    ax.set_xticks(x + w * (len(keys) - 1) / 2, names, rotation=20, fontsize=8)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_bars(rows: dict, baseline: str, metrics: list[tuple[str, str]], path: Path, title: str) -> None:
    """Grouped bars of each design's metrics relative to the baseline's (the paper's Figs. 18-19)."""
    names = [d for d, r in rows.items() if r.get("feasible")]
    if baseline not in names:
        return
    fig, ax = plt.subplots(figsize=(10, 4), constrained_layout=True)
    width = 0.8 / len(metrics)
    x = np.arange(len(names))
    for i, (key, label) in enumerate(metrics):
        base = rows[baseline][key]
        vals = [rows[d][key] / base if base else 0.0 for d in names]
        ax.bar(x + (i - (len(metrics) - 1) / 2) * width, vals, width, label=label)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel(f"relative to {baseline}")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
