"""The comparison's PNG plots (matplotlib, headless): goodput per system, and P99 latencies
against the offered rate."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def goodput_bars(rows: list[dict], title: str, path: Path) -> None:
    names = [r["system"] for r in rows]
    vals = [r["goodput_rps"] or 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(rows)), 3.6), constrained_layout=True)
    bars = ax.bar(names, vals, color=["tab:orange" if r["split_system"] else "tab:blue" for r in rows])
    for b, r in zip(bars, rows):
        ax.annotate(f"{r['goodput_rps']:.4g}\n{r['split']}" if r["goodput_rps"] else "none",
                    (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("goodput (req/s)")
    ax.set_ylim(0, max(vals + [1.0]) * 1.25)
    ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def latency_curves(curves: dict[str, list[dict]], title: str, path: Path) -> None:
    """One panel per metric: P99 TTFT, TBT and E2E (s, log scale) against the offered rate."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), constrained_layout=True)
    for ax, (m, label) in zip(axes, (("ttft", "P99 TTFT"), ("tbt", "P99 TBT"), ("e2e", "P99 E2E"))):
        for name, pts in curves.items():
            ax.plot([p["rps"] for p in pts], [p[f"{m}_p99_s"] for p in pts], marker="o", ms=3, label=name)
        ax.set_yscale("log")
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel(f"{label} (s)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=120)
    plt.close(fig)
