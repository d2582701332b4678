"""`provision --day peak-hour|whole` (provision/days.py): the search's simulations over the day's
busiest hour or the whole day of a rate shape, scaled to each simulation's rate, cached as any job."""

import json

import pytest

from splitserve.cli import main
from splitserve.errors import UserError
from splitserve.provision.command import run_provision
from splitserve.provision.evaluate import Cache, run_job
from splitserve.provision.request import ProvisionRequest
from splitserve.workload.shape import DAY_S, HOUR_S, built_in_shapes, parse_shape, peak_hour


def request(**kw):
    base = dict(objective="cost", rps=1.0, designs=("splitwise-hh",), max_prompt=2, max_token=2, workers=1,
                use_cache=False, progress=False)
    return ProvisionRequest(**{**base, **kw})


def test_the_day_sets_each_simulations_span_and_shape():
    code = built_in_shapes()["azure-code"]
    start = peak_hour(code)
    sc = request(day="peak-hour").scenario()
    assert (sc.duration, sc.rate_profile) == (HOUR_S, f"azure-code:start={start:g}")
    sc = request(day="whole", workload="conversation").scenario()
    assert (sc.duration, sc.rate_profile) == (DAY_S, "azure-conv")
    sc = request(rate_profile="azure-conv", duration=600.0).scenario()
    assert (sc.duration, sc.rate_profile) == (600.0, "azure-conv")
    sc = request().scenario()
    assert (sc.duration, sc.rate_profile) == (120.0, "")
    job = sc.job("splitwise-hh", (1, 1), 3.0)
    assert job.rate_profile == ""


def test_a_peak_hour_job_simulates_that_hour_at_the_days_mean():
    sc = request(day="peak-hour").scenario()
    out = run_job(sc.job("splitwise-hh", (2, 1), 1.5))
    prof = parse_shape(sc.rate_profile, 1.5)
    want = prof.expected(0.0, HOUR_S)
    assert want > 1.5 * HOUR_S                    # the busiest hour is above the day's mean
    assert out.requests == pytest.approx(want, rel=0.05)


def test_the_day_is_part_of_the_cache_key(tmp_path):
    cache = Cache(tmp_path)
    plain = request().scenario().job("splitwise-hh", (1, 1), 2.0)
    peak = request(day="peak-hour").scenario().job("splitwise-hh", (1, 1), 2.0)
    whole = request(day="whole").scenario().job("splitwise-hh", (1, 1), 2.0)
    assert len({cache.key(plain), cache.key(peak), cache.key(whole)}) == 3


def test_the_search_runs_on_the_peak_hour():
    res = run_provision(request(day="peak-hour", rps=0.5))
    assert res["scenario"]["duration"] == HOUR_S and res["scenario"]["rate_profile"].startswith("azure-code")
    assert res["best"] is not None and res["search"]["simulated"] >= 1


@pytest.mark.parametrize("kw, match", [
    (dict(day="noon"), "peak-hour or whole"),
    (dict(day="whole", workload="sharegpt"), "give --rate-profile"),
    (dict(rate_profile="0:5,60:10"), "rate shape's name alone"),
    (dict(rate_profile="azure-code:mean=3"), "rate shape's name alone"),
    (dict(rate_profile="diurnal", day="whole"), "cover about one hour"),
    (dict(rate_profile="mine.json", backend="ray"), "--backend ray takes a built-in"),
])
def test_bad_days_are_user_errors(kw, match):
    with pytest.raises(UserError, match=match):
        request(**kw)


def test_the_other_objectives_refuse_a_day(capsys):
    code = main(["provision", "--objective", "capacity-per-dollar", "--day", "whole", "--json"])
    _, err = capsys.readouterr()
    assert code == 2 and "--day and --rate-profile go with" in err


def test_the_command_takes_the_day(tmp_path, capsys):
    code = main(["provision", "--objective", "cost", "--rps", "0.5", "-d", "splitwise-hh", "--max-prompt", "1",
                 "--max-token", "1", "--workers", "1", "--no-cache", "--quiet", "--json", "--day", "peak-hour",
                 "--rate-profile", "azure-conv"])
    out, _ = capsys.readouterr()
    res = json.loads(out)
    assert code in (0, 1, None) and res["scenario"]["rate_profile"].startswith("azure-conv:start=")
