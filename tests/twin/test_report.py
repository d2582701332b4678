"""twin/report.py: the live-vs-simulated table, report.md, cdf.png and bench's requests.jsonl."""

import json

import pytest

from splitserve.twin.report import (Row, compare, samples_from_requests_jsonl, table_text,
                                    write_report)


def _lat(p50, p90, p99, mean=None):
    return {"p50": p50, "p90": p90, "p99": p99, "mean": p50 if mean is None else mean}


LIVE = {"completed": 10, "failed": 0, "throughput_rps": 2.0,
        "ttft_s": _lat(0.100, 0.200, 0.400), "tbt_s": _lat(0.020, 0.030, 0.050),
        "e2e_s": _lat(1.0, 2.0, 4.0),
        "cluster": {"design": None, "machines": None, "cost_per_hour": None}}
SIM = {"completed": 10, "failed": 1, "throughput_rps": 1.8,
       "ttft_s": _lat(0.108, 0.250, 0.400), "tbt_s": _lat(0.020, 0.030, 0.050),
       "e2e_s": _lat(0.85, 2.0, 4.0), "queue_s": _lat(0.0, 0.01, 0.02),
       "cluster": {"preemptions": 3, "borrowed_into_mixed_pool": 1},
       "kv_transfer": {"transfers": 10, "visible_s": _lat(0.005, 0.006, 0.008)}}


def _by_metric(rows):
    return {r.metric: r for r in rows}


def test_relative_error_and_bounds_by_hand():
    rows = _by_metric(compare(LIVE, SIM))
    # TTFT P50: (0.108 - 0.100) / 0.100 = +8% within the default 10% bound
    r = rows["TTFT P50 (s)"]
    assert (r.live, r.sim, r.bound, r.ok) == (0.100, 0.108, 0.10, True)
    assert r.rel_error == pytest.approx(0.08)
    # TTFT P90: (0.250 - 0.200) / 0.200 = +25% outside the default 20% bound
    r = rows["TTFT P90 (s)"]
    assert r.rel_error == pytest.approx(0.25) and (r.bound, r.ok) == (0.20, False)
    # E2E P50: (0.85 - 1.0) / 1.0 = -15% outside 10%
    r = rows["E2E P50 (s)"]
    assert r.rel_error == pytest.approx(-0.15) and r.ok is False
    # P99 has no default bound; throughput has none either: error given, ok None
    r = rows["TTFT P99 (s)"]
    assert r.rel_error == pytest.approx(0.0) and (r.bound, r.ok) == (None, None)
    r = rows["throughput (req/s)"]
    assert r.rel_error == pytest.approx(-0.10) and (r.bound, r.ok) == (None, None)
    # live failed = 0: no relative error
    assert rows["failed"] == Row(metric="failed", live=0.0, sim=1.0, rel_error=None)


def test_custom_bounds_replace_defaults():
    rows = _by_metric(compare(LIVE, SIM, bounds={"p50": 0.05, "p99": 0.01}))
    assert rows["TTFT P50 (s)"].ok is False           # 8% > 5%
    assert rows["TTFT P90 (s)"].bound is None         # p90 no longer bounded
    assert rows["E2E P99 (s)"].ok is True             # 0% <= 1%
    assert rows["queue P99 (s)"].bound is None        # bounds apply to ttft/tbt/e2e only


def test_missing_live_metric_gives_no_error():
    rows = _by_metric(compare(LIVE, SIM))
    for name, sim in [("queue P90 (s)", 0.01), ("preemptions", 3.0), ("borrowed machines", 1.0),
                      ("KV transfer P50 (s)", 0.005), ("KV transfer P99 (s)", 0.008)]:
        assert rows[name] == Row(metric=name, live=None, sim=sim, rel_error=None)


def test_metric_in_neither_summary_is_not_listed():
    rows = _by_metric(compare(LIVE, {k: v for k, v in SIM.items() if k != "kv_transfer"}))
    assert not any(m.startswith("KV transfer") for m in rows)
    assert len(rows) == 12 + 3 + 2            # 4 metrics x 3 percentiles, 3 counts, 2 cluster


def test_table_text_has_every_row():
    text = table_text(compare(LIVE, SIM))
    lines = text.splitlines()
    assert lines[0].split() == ["metric", "live", "simulated", "error", "bound", "ok"]
    ttft = next(line for line in lines if line.startswith("TTFT P90"))
    assert ttft.split()[-4:] == ["0.25", "+25.0%", "±20%", "NO"]
    assert len(lines) == 2 + len(compare(LIVE, SIM))


def test_write_report_markdown_and_cdf(tmp_path):
    rows = compare(LIVE, SIM)
    live = {"ttft": [0.09, 0.1, 0.11], "tbt": [0.001, 0.02, 0.5], "e2e": [0.9, 1.0, 1.2]}
    sim = {"ttft": [0.1, 0.12], "tbt": [0.02, 0.03], "e2e": [0.8, 1.1]}
    path = write_report(tmp_path / "out", rows, title="tiny: live vs simulated",
                        meta={"live": "bench, 2 req/s for 10 s", "simulated": "simulate, roofline"},
                        live_samples=live, sim_samples=sim)
    assert path == tmp_path / "out" / "report.md"
    md = path.read_text()
    assert md.startswith("# tiny: live vs simulated\n")
    assert "- **live**: bench, 2 req/s for 10 s" in md
    assert "| metric | live | simulated | error | bound | ok |" in md
    assert "| TTFT P50 (s) | 0.1 | 0.108 | +8.0% | ±10% | yes |" in md
    assert "| E2E P50 (s) | 1 | 0.85 | -15.0% | ±10% | NO |" in md
    assert "| preemptions | n/a | 3 | n/a |  |  |" in md
    assert "cdf.png" in md
    png = (tmp_path / "out" / "cdf.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000


def test_write_report_without_samples_has_no_png(tmp_path):
    path = write_report(tmp_path, compare(LIVE, SIM), title="t", meta={})
    assert path.exists() and not (tmp_path / "cdf.png").exists()
    assert "cdf.png" not in path.read_text()


def _record(index, outcome, ttft, e2e, tokens, reason=None, status=200):
    return {"index": index, "arrival": 0.5 * index, "sent": 0.5 * index + 0.001,
            "prompt_tokens": 64, "max_tokens": tokens, "outcome": outcome, "reason": reason,
            "status": status, "ttft": ttft, "e2e": e2e, "tokens": tokens,
            "end": 0.5 * index + (e2e or 0.0)}


def test_samples_from_requests_jsonl(tmp_path):
    lines = [
        _record(0, "completed", 0.010, 0.040, 4),   # 3 gaps of (0.040 - 0.010) / 3 = 0.010
        _record(1, "completed", 0.020, 0.020, 1),   # one token: no gap
        _record(2, "failed", 0.030, None, 2, reason="stream_dropped: ReadError"),
        _record(3, "rejected", None, None, 0, reason="http_429", status=429),
        _record(4, "completed", 0.005, 0.045, 3),   # 2 gaps of (0.045 - 0.005) / 2 = 0.020
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    s = samples_from_requests_jsonl(path)
    assert s["ttft"] == pytest.approx([0.010, 0.020, 0.005])
    assert s["e2e"] == pytest.approx([0.040, 0.020, 0.045])
    assert s["tbt"] == pytest.approx([0.010, 0.010, 0.010, 0.020, 0.020])
