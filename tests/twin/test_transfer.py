"""The KV link's line through measured transfers (twin/transfer.py `_fit`), by hand."""

from __future__ import annotations

import pytest

from splitserve.twin.transfer import _fit


def at(fit: dict, nbytes: float) -> float:
    return fit["fixed_s"] + nbytes / fit["bandwidth_bytes_per_s"]


def test_a_line_is_recovered_exactly():
    fit = _fit([(n, 0.001 + n / 1e9) for n in (1 << 19, 1 << 23, 1 << 25, 1 << 27)])
    assert fit["fixed_s"] == pytest.approx(0.001) and fit["bandwidth_bytes_per_s"] == pytest.approx(1e9)


def test_every_size_counts_not_only_the_largest():
    # tcp medians of small-mha's KV (16 to 4,096 tokens) on the 2-core dev VM, 2026-11-29: a least
    # squares fit of the seconds (its fixed cost clipped at 0) erred -3%, +16%, +17%, +1% at these
    # sizes, the 256- and 1,024-token transfers the twin's prompts make by 16-17%; a fit of the
    # relative error: -0.4%, +4.6%, +4.6%, -10.2%
    pts = [(524288, 1.54e-3), (8388608, 20.55e-3), (33554432, 81.63e-3), (134217728, 379.54e-3)]
    errors = [at(_fit(pts), n) / s - 1 for n, s in pts]
    assert errors == pytest.approx([-0.004, 0.046, 0.046, -0.102], abs=0.001)


def test_no_negative_fixed_cost():
    fit = _fit([(1000, 0.5e-3), (2000, 2.0e-3)])   # the line through both would cross zero at 667 B
    assert fit["fixed_s"] == 0.0 and fit["bandwidth_bytes_per_s"] > 0
