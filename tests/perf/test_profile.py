"""ProfilePerfModel and ProfilePowerModel: exact at the table, linear between, last slope beyond."""

import statistics
import time
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.catalog import load_hardware, load_model
from splitserve.errors import UserError
from splitserve.perf import make_perf_model
from splitserve.perf.power import AnalyticalPowerModel, ProfilePowerModel
from splitserve.perf.profile import MIN_TIME_S, ProfilePerfModel, read_profile_rows

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO.parent / "shared" / "profiles" / "splitwise_a100_h100_perf_model.csv"
CONFIGS = [
    (m, h, tp)
    for m, hs, tps in [
        ("llama2-70b", ("a100-80gb", "h100-80gb", "h100-80gb-pcap"), (2, 4, 8)),
        ("bloom-176b", ("a100-80gb", "h100-80gb", "h100-80gb-pcap"), (8,)),
    ]
    for h in hs
    for tp in tps
]


@pytest.fixture(scope="module")
def profile_path() -> Path:
    if not PROFILE.exists():
        pytest.skip(f"Splitwise profile not found at {PROFILE}")
    return PROFILE


# ----------------------------------------------------------------------------- synthetic table
# Hand-made profile (ms). Prompt sweep at batch 1, batch sweep at 512/128, and batch-1 token
# times exactly on the line 18 + 0.002 * (mean context p + t/2).


def row(p, b, t, prompt_ms, token_ms, peak=0.0, avg=0.0):
    return {"model": "m", "hardware": "h", "prompt_size": p, "batch_size": b, "token_size": t,
            "peak_power": peak, "average_power": avg, "prompt_time": prompt_ms,
            "token_time": token_ms, "e2e_time": 0.0, "tensor_parallel": 8}


def line(p, t=128):
    return 18.0 + 0.002 * (p + t / 2)


SYNTH = [
    row(128, 1, 128, 10.0, line(128)),
    row(256, 1, 128, 20.0, line(256)),
    row(512, 1, 128, 29.0, line(512)),
    row(512, 1, 128, 30.0, line(512)),
    row(512, 1, 128, 35.0, line(512)),          # median of 29, 30, 35 = 30
    row(1024, 1, 128, 50.0, line(1024)),
    row(512, 2, 128, 50.0, 22.0),                # T = 1024 as well: median(50, 50) = 50
    row(512, 4, 128, 90.0, 26.0),                # T = 2048
]


def test_synthetic_exact_at_points_and_linear_between():
    pm = ProfilePerfModel.from_rows(SYNTH)
    ms = 1e-3
    assert pm.prompt_time(128) == pytest.approx(10 * ms, rel=1e-12)
    assert pm.prompt_time(512) == pytest.approx(30 * ms, rel=1e-12)
    assert pm.prompt_time(2048) == pytest.approx(90 * ms, rel=1e-12)
    assert pm.prompt_time(384) == pytest.approx(25 * ms, rel=1e-12)        # (20 + 30) / 2
    assert pm.prompt_time(1536) == pytest.approx(70 * ms, rel=1e-12)       # (50 + 90) / 2
    # beyond the table: last slope (90 - 50) / 1024 ms per token
    assert pm.prompt_time(4096) == pytest.approx(170 * ms, rel=1e-12)
    # below the first point: first slope, then the floor
    assert pm.prompt_time(64) == pytest.approx(5 * ms, rel=1e-12)
    assert pm.prompt_time(1) == MIN_TIME_S
    assert pm.prompt_time(0) == 0.0
    # decode at the batch sweep's own context (512 + 128/2 = 576 per request): the batch curve
    ref = pm.ctx_ref
    assert ref == 576
    assert pm.token_time(1, 576) == pytest.approx(line(512) * ms, rel=1e-12)
    assert pm.token_time(2, 2 * 576) == pytest.approx(22 * ms, rel=1e-12)
    assert pm.token_time(3, 3 * 576) == pytest.approx(24 * ms, rel=1e-12)   # midpoint
    assert pm.token_time(8, 8 * 576) == pytest.approx(34 * ms, rel=1e-12)   # 26 + 4 * 2
    # the context factor is the batch-1 line, normalised at 576
    assert pm.ctx_a == pytest.approx(18 * ms) and pm.ctx_k == pytest.approx(0.002 * ms)
    assert pm.token_time(1, 1088) == pytest.approx(line(1024) * ms, rel=1e-12)
    assert pm.token_time(4, 4 * 1088) == pytest.approx(26 * ms * line(1024) / line(512), rel=1e-12)
    # mixed: the decodes ride in the prefill pass
    assert pm.mixed_time(100, 4, 4 * 576) == pytest.approx(26 * ms, rel=1e-12)
    assert pm.mixed_time(2000, 4, 4 * 576) == pytest.approx(pm.prompt_time(2004), rel=1e-12)
    assert pm.mixed_time(2000, 0, 0) == pm.prompt_time(2000)
    assert pm.mixed_time(0, 4, 4 * 576) == pm.token_time(4, 4 * 576)
    assert pm.mixed_time(0, 0, 0) == 0.0


def test_synthetic_broken_batch_point_is_dropped():
    rows = SYNTH + [row(512, 8, 128, 5.0, 1.0)]  # 4096 prompt tokens in 5 ms after 90 ms
    pm = ProfilePerfModel.from_rows(rows)
    assert len(pm.dropped) == 1 and "batch_size=8" in pm.dropped[0]
    assert pm.prompt_xs[-1] == 2048 and pm.batch_xs[-1] == 4
    assert pm.prompt_time(4096) == pytest.approx(0.170, rel=1e-12)


def test_synthetic_non_monotone_medians_are_pooled():
    rows = [row(128, 1, 128, 12.0, 20.0), row(256, 1, 128, 10.0, 20.0),
            row(512, 1, 128, 30.0, 20.0), row(512, 2, 128, 60.0, 21.0)]
    pm = ProfilePerfModel.from_rows(rows)
    assert pm.prompt_time(128) == pytest.approx(0.011) and pm.prompt_time(256) == pytest.approx(0.011)
    assert pm.prompt_time(512) == pytest.approx(0.030)


# ----------------------------------------------------------------------------- the real profile


def _unique_rows(path, model, hw, tp):
    return read_profile_rows(path, model, hw, tp)


def test_reproduces_profile_medians_at_table_points(profile_path):
    rows = _unique_rows(profile_path, "llama2-70b", "a100-80gb", 8)
    pm = ProfilePerfModel.from_csv(profile_path, "llama2-70b", "a100-80gb", 8)
    by_t = defaultdict(list)
    for r in rows:
        by_t[r["batch_size"] * r["prompt_size"]].append(r["prompt_time"])
    med = {t: statistics.median(v) / 1e3 for t, v in by_t.items()}
    assert sorted(med) == [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
    for t, m in med.items():  # these medians are already monotone: reproduced exactly
        assert pm.prompt_time(t) == pytest.approx(m, rel=1e-12)
    assert pm.prompt_time(768) == pytest.approx((med[512] + med[1024]) / 2, rel=1e-12)
    assert pm.prompt_time(3072) == pytest.approx((med[2048] + med[4096]) / 2, rel=1e-12)
    slope = (med[32768] - med[16384]) / 16384
    assert pm.prompt_time(65536) == pytest.approx(med[32768] + slope * 32768, rel=1e-12)

    # decode, on a config whose batch medians are monotone (llama2-70b h100 tp 8)
    rows = _unique_rows(profile_path, "llama2-70b", "h100-80gb", 8)
    pm = ProfilePerfModel.from_csv(profile_path, "llama2-70b", "h100-80gb", 8)
    by_b = defaultdict(list)
    for r in rows:
        if r["prompt_size"] == 512 and r["token_size"] == 128:
            by_b[r["batch_size"]].append(r["token_time"])
    tm = {b: statistics.median(v) / 1e3 for b, v in by_b.items()}
    assert sorted(tm) == [1, 2, 4, 8, 16, 32, 64]
    for b, m in tm.items():
        assert pm.token_time(b, b * 576) == pytest.approx(m, rel=1e-12)
    assert pm.token_time(24, 24 * 576) == pytest.approx((tm[16] + tm[32]) / 2, rel=1e-12)
    slope = (tm[64] - tm[32]) / 32
    assert pm.token_time(100, 100 * 576) == pytest.approx(tm[64] + 36 * slope, rel=1e-12)
    assert pm.source == f"profile:{profile_path}"


def test_known_broken_points_are_dropped(profile_path):
    for hw in ("a100-80gb", "h100-80gb", "h100-80gb-pcap"):
        pm = ProfilePerfModel.from_csv(profile_path, "llama2-70b", hw, 2)
        assert len(pm.dropped) == 1 and "batch_size=64" in pm.dropped[0]
        assert pm.batch_xs[-1] == 32
    for m, hw, tp in CONFIGS:
        if tp != 2:
            assert ProfilePerfModel.from_csv(profile_path, m, hw, tp).dropped == ()


@pytest.fixture(scope="module")
def all_models(profile_path):
    return [ProfilePerfModel.from_csv(profile_path, *c) for c in CONFIGS]


@settings(max_examples=300, deadline=None)
@given(i=st.integers(0, len(CONFIGS) - 1), t=st.integers(1, 200_000), d=st.integers(0, 50_000),
       b=st.integers(1, 600), db=st.integers(0, 100), x=st.integers(0, 20_000),
       dx=st.integers(0, 20_000))
def test_monotone_in_tokens_batch_and_context(all_models, i, t, d, b, db, x, dx):
    pm = all_models[i]
    assert 0 < pm.prompt_time(t) <= pm.prompt_time(t + d)
    assert 0 < pm.token_time(b, b * x) <= pm.token_time(b, b * x + dx)       # more context
    assert pm.token_time(b, b * x) <= pm.token_time(b + db, (b + db) * x)    # more requests
    assert pm.mixed_time(t, b, b * x) >= max(pm.prompt_time(t), pm.token_time(b, b * x))


def test_calls_are_fast():
    pm = ProfilePerfModel.from_rows(SYNTH)
    n = 20_000
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for k in range(n):
            pm.mixed_time(1500, 37, 40_000)
        best = min(best, (time.perf_counter() - t0) / n)
    assert best < 3e-6  # ~0.3 us on the development machine; loose for slow CI hosts


def test_factory_picks_profile_operators_or_roofline(profile_path):
    llama = load_model("llama2-70b")
    perf, power = make_perf_model(llama, load_hardware("dgx-a100"), profile=str(profile_path))
    assert isinstance(perf, ProfilePerfModel) and perf.source == f"profile:{profile_path}"
    assert isinstance(power, ProfilePowerModel)
    perf, power = make_perf_model(llama, load_hardware("dgx-h100"), profile=str(profile_path))
    assert perf.source.startswith("profile:")
    assert isinstance(power, AnalyticalPowerModel)  # the H100 rows carry no power
    # no rows: H200 (never profiled: the roofline), llama3-8b (not in the file), tp 1 (not measured):
    # the operator model; without the file, llama2-70b at tp 8 gets the roofline fitted on it
    assert make_perf_model(llama, load_hardware("dgx-h200"), profile=profile_path)[0].source == "roofline"
    assert make_perf_model(load_model("llama3-8b"), load_hardware("dgx-h100"),
                           profile=profile_path)[0].source == "operators"
    assert make_perf_model(llama, load_hardware("dgx-a100"), 1, profile_path)[0].source == "operators"
    assert make_perf_model(llama, load_hardware("dgx-a100"))[0].source == "roofline"
    with pytest.raises(UserError):
        make_perf_model(llama, load_hardware("dgx-a100"), profile="/nonexistent/profile.csv")
    with pytest.raises(UserError):
        ProfilePerfModel.from_csv(profile_path, "llama3-8b", "a100-80gb", 8)


# ----------------------------------------------------------------------------- profile power


def test_profile_power_interpolates_measured_fractions(profile_path):
    rows = _unique_rows(profile_path, "llama2-70b", "a100-80gb", 8)
    hw = load_hardware("dgx-a100")
    pw = ProfilePowerModel.from_rows(rows, hw, 8)
    # 2048 prompt tokens: 4 x 512 (peak 0.918678125) and 1 x 2048 (0.98930625), 5 rows each
    frac = (0.918678125 + 0.98930625) / 2
    assert pw.prompt_power_w(2048) == pytest.approx(frac * 400 * 8)
    # decode at batch 16: average_power 0.458421875; batch 64 was not measured (zeros): hold 16
    assert pw.token_power_w(16) == pytest.approx(0.458421875 * 400 * 8)
    assert pw.token_power_w(64) == pw.token_power_w(16)
    # above-TDP peaks (1.087 at tp 2) are clipped to the cap (uncapped: TDP)
    pw2 = ProfilePowerModel.from_rows(_unique_rows(profile_path, "llama2-70b", "a100-80gb", 2), hw, 2)
    assert pw2.prompt_power_w(1024) <= 400 * 2 + 0.2 * 400 * 6
    assert pw.idle_power_w() == AnalyticalPowerModel(hw, 8).idle_power_w()


def test_profile_power_never_exceeds_cap_and_falls_back():
    hw = load_hardware("dgx-h100-cap")
    rows = [row(512, b, 128, 1.0, 1.0, peak=1.1, avg=0.9) for b in (1, 2, 4)]
    pw = ProfilePowerModel.from_rows(rows, hw, 8)
    for x in (1, 512, 2048, 10**6):
        assert pw.prompt_power_w(x) == pytest.approx(hw.power_cap_w)
        assert pw.token_power_w(x) == pytest.approx(hw.power_cap_w)
    empty = ProfilePowerModel.from_rows([row(512, 1, 128, 1.0, 1.0)], load_hardware("dgx-h100"), 8)
    assert not empty.has_data
    fb = AnalyticalPowerModel(load_hardware("dgx-h100"), 8)
    assert empty.prompt_power_w(1000) == fb.prompt_power_w(1000)
    assert empty.token_power_w(10) == fb.token_power_w(10)
