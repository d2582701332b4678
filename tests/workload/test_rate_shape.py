"""Measured rate shapes (workload/shape.py): the built-in Azure 2023 shapes as the traces give them,
arrivals that follow a shape minute by minute at the asked mean over a day, the peak hour, shape
files (scripts/rate_shape.py) and the errors."""

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from splitserve.errors import UserError
from splitserve.workload import BLOCK, make_workload
from splitserve.workload.rate import thinned_arrivals
from splitserve.workload.shape import DAY_S, HOUR_S, built_in_shapes, parse_shape, peak_hour

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT.parent / "shared" / "traces"
DATA = ROOT / "src" / "splitserve" / "workload" / "data" / "rate_shapes.json"


def script():
    spec = importlib.util.spec_from_file_location("rate_shape", ROOT / "scripts" / "rate_shape.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_built_in_shapes_are_the_traces_minutes():
    doc = json.loads(DATA.read_text())
    shapes = built_in_shapes()
    assert set(shapes) == {"azure-code", "azure-conv"}
    for entry in doc["shapes"]:
        s = shapes[entry["name"]]
        counts = np.asarray(entry["counts"], dtype=float)
        assert s.bin_s == 60 and len(s.relative) == len(counts) == int(entry["span_s"] // 60)
        assert np.allclose(s.relative, counts / counts.mean())
        assert sum(entry["counts"]) == entry["requests"]
    assert len(shapes["azure-code"].relative) == 57 and len(shapes["azure-conv"].relative) == 58


@pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces not here")
def test_the_data_file_regenerates_from_the_traces():
    mod = script()
    doc = json.loads(DATA.read_text())
    for entry in doc["shapes"]:
        got = mod.shape_of(TRACES / entry["trace"], entry["name"], 60.0, None)
        assert got == entry


def test_scaled_to_mean_or_peak_and_shifted():
    code = built_in_shapes()["azure-code"]
    p = parse_shape("azure-code", rps=70.0)
    assert p.mean == 70.0 and p.peak == pytest.approx(70.0 * max(code.relative))
    assert p.expected(0.0, code.period) == pytest.approx(70.0 * code.period)
    q = parse_shape("azure-code:peak=100")
    assert q.peak == pytest.approx(100.0) and q.rate(60.0 * np.argmax(code.relative) + 1).item() == pytest.approx(100)
    s = parse_shape("azure-conv:mean=8:start=1290")
    t = np.array([0.0, 29.9, 30.0, 5000.0])
    assert s.rate(t).tolist() == parse_shape("azure-conv:mean=8").rate(t + 1290).tolist()
    grid = np.arange(0.0, 7000.0, 0.5) + 0.25                  # the integral, by the midpoint rule
    assert s.expected(0.0, 7000.0) == pytest.approx(float(s.rate(grid).sum()) * 0.5, rel=1e-9)
    assert s.expected(100.5, 200.5) == pytest.approx(float(s.rate(np.arange(100.5, 200.5, 0.5) + 0.25).sum()) * 0.5)


@pytest.mark.parametrize("name", ["azure-code", "azure-conv"])
def test_a_day_of_arrivals_has_the_mean_and_follows_the_minutes(name):
    shape = built_in_shapes()[name]
    mean = 12.0
    wl = make_workload("coding", rps=mean, duration=DAY_S, rate_profile=name, seed=4)
    n = sum(1 for _ in wl)
    assert n / DAY_S == pytest.approx(mean, rel=0.01)
    assert wl.rps == pytest.approx(mean, rel=0.003)      # the day is 25.3 periods: a part period off 1
    # minute by minute: arrivals folded on the shape's period against its relative rates
    t = np.concatenate([a for a, _ in _blocks(parse_shape(name, rps=40.0), DAY_S)])
    counts = np.bincount(((t % shape.period) // shape.bin_s).astype(int), minlength=len(shape.relative))
    exposure = np.full(len(counts), DAY_S // shape.period * shape.bin_s)
    exposure[: int(DAY_S % shape.period // shape.bin_s)] += shape.bin_s
    got = counts / exposure / 40.0
    rel = np.asarray(shape.relative)
    assert np.all(got[rel == 0] == 0)
    busy = rel > 0.1
    assert np.allclose(got[busy], rel[busy], rtol=0.05)
    assert np.corrcoef(got, rel)[0, 1] > 0.999


def _blocks(profile, end):
    for arrival, t in thinned_arrivals(np.random.default_rng(1), profile, BLOCK):
        yield arrival[arrival < end], t
        if t >= end:
            return


def test_the_peak_hour_is_the_busiest_hour_of_the_day():
    for shape in built_in_shapes().values():
        start = peak_hour(shape)
        prof = parse_shape(shape.name, rps=1.0)
        best = max(prof.expected(s, s + HOUR_S) for s in np.arange(0.0, DAY_S - HOUR_S + 1, 10.0))
        assert prof.expected(start, start + HOUR_S) == pytest.approx(best, rel=1e-12)
        assert 0 <= start <= DAY_S - HOUR_S


def test_a_shape_file_folded_on_a_day(tmp_path):
    # two days of a trace whose requests come only from 09:00 to 17:00, twice as many 12:00-13:00
    rng = np.random.default_rng(0)
    rows = []
    for day in (16, 17):
        for hour in range(9, 17):
            for s in np.sort(rng.uniform(0, 3600, 40 if hour == 12 else 20)):
                rows.append(f"2023-11-{day} {hour:02d}:{int(s // 60):02d}:{s % 60:09.6f},100,10")
    rows.append("2023-11-17 23:59:59.000000,100,10")      # covers the second day to its end
    csv = tmp_path / "days.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    entry = script().shape_of(csv, "office", 3600.0, 86400.0)
    assert entry["counts"][12] == 80 and entry["counts"][9] == 40 and entry["counts"][3] == 0
    out = tmp_path / "office.json"
    out.write_text(json.dumps({"shapes": [entry]}))
    p = parse_shape(str(out), rps=10.0)
    assert p.shape.period == DAY_S and len(p.shape.relative) == 24
    rate = p.rate(np.arange(24) * 3600.0 + 1)
    assert rate[3] == 0 and rate[12] == pytest.approx(2 * rate[10])
    assert p.expected(0, DAY_S) / DAY_S == pytest.approx(10.0)
    assert peak_hour(p.shape) == 12 * 3600.0
    wl = make_workload("coding", rps=10.0, duration=DAY_S, rate_profile=str(out))
    hours = np.bincount([int(r.arrival // 3600) for r in wl], minlength=24)
    assert hours[:9].sum() == 0 and hours[17:23].sum() == 0 and hours[12] > 1.6 * hours[10]   # 23:59: the marker


@pytest.mark.parametrize("spec, rps, match", [
    ("diurnal", 70.0, "cover about one hour"),
    ("azure-code:mean=5:peak=9", None, "mean or peak, not both"),
    ("azure-code:mean=5", 70.0, "leave out --rps"),
    ("azure-code", None, "give its mean rate"),
    ("azure-code:speed=3", 1.0, "mean=R, :peak=R or :start=S"),
    ("azure-code:peak=-1", None, "peak must be finite"),
    ("nowhere.json", 1.0, "not found"),
])
def test_bad_shapes_are_user_errors(spec, rps, match):
    with pytest.raises(UserError, match=match):
        parse_shape(spec, rps)


def test_rps_is_a_shapes_mean_but_not_a_piecewise_profiles():
    wl = make_workload("conversation", rps=3.0, duration=HOUR_S, rate_profile="azure-conv")
    assert wl.rate_profile.mean == 3.0 and math.isclose(wl.rps, wl.rate_profile.expected(0, HOUR_S) / HOUR_S)
    with pytest.raises(UserError, match="not both"):
        make_workload("coding", rps=3.0, rate_profile="0:1")
