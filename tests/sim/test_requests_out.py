"""`simulate --requests-out` (sim/requests_out.py): a row per request, written as it completes, whose
latencies give back the summary's percentiles within the histograms' precision."""

import csv
import json
import math

import numpy as np
import pytest

from splitserve.cli import main
from splitserve.errors import UserError
from splitserve.sim.requests_out import COLUMNS, RequestsOut
from splitserve.sim.run import SimRequest, simulate

HIST = 0.0006         # a histogram's percentile is within 0.05% of the order statistic (report/histogram.py)
ROUND = 2e-6          # the file's microseconds


def nearest_rank(x, q):
    return float(np.sort(x)[max(1, math.ceil(q * len(x))) - 1])


def run(path, **kw):
    req = SimRequest(design="splitwise-hh", prompt_machines=3, token_machines=1, rps=6.0, duration=120.0, seed=5, **kw)
    with RequestsOut(path) as rows:
        summary, _ = simulate(req, requests_out=rows)
    return summary, rows.rows


def read(path):
    if path.suffix == ".csv":
        with path.open() as f:
            r = list(csv.DictReader(f))
        assert list(r[0]) == list(COLUMNS)
        return [{k: (float(v) if v != "" else None) for k, v in row.items()} for row in r]
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("name", ["rows.csv", "rows.jsonl"])
def test_rows_are_the_requests_and_give_the_summarys_percentiles(tmp_path, name):
    path = tmp_path / name
    summary, written = run(path, rate_profile="azure-conv")
    rows = read(path)
    n = summary["requests"]
    assert written == len(rows) == n == summary["completed"] > 500
    assert sorted(int(r["id"]) for r in rows) == list(range(n))
    for key, col in (("ttft_s", "ttft_s"), ("e2e_s", "e2e_s")):
        x = np.array([r[col] for r in rows])
        for q in (0.5, 0.9, 0.99):
            assert nearest_rank(x, q) == pytest.approx(summary[key][f"p{round(q * 100)}"], rel=HIST, abs=ROUND)
        assert x.mean() == pytest.approx(summary[key]["mean"], abs=ROUND)
    # every token gap: a request's mean gap times its gaps, summed, is the TBT histogram's sum
    gaps = [(r["tbt_mean_s"], r["output_tokens"] - 1) for r in rows if r["output_tokens"] > 1]
    assert all(r["tbt_mean_s"] is None for r in rows if r["output_tokens"] == 1)
    mean_tbt = sum(m * k for m, k in gaps) / sum(k for _, k in gaps)
    assert mean_tbt == pytest.approx(summary["tbt_s"]["mean"], rel=1e-5)
    assert all(r["arrival_s"] < 120.0 and r["e2e_s"] >= r["ttft_s"] > 0 for r in rows)
    assert {int(r["prompt_machine"]) for r in rows} <= {0, 1, 2, 3} and {int(r["token_machine"]) for r in rows} <= {0, 1, 2, 3}


def test_rows_come_in_completion_order_while_the_run_goes(tmp_path):
    path = tmp_path / "rows.csv"
    run(path)
    rows = read(path)
    ends = [r["arrival_s"] + r["e2e_s"] for r in rows]
    assert all(b >= a - ROUND for a, b in zip(ends, ends[1:]))      # the front end's overhead is the same for all


def test_the_command_writes_the_file(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    code = main(["simulate", "--duration", "20", "--rps", "3", "--quiet", "--json", "--requests-out", str(path)])
    out, _ = capsys.readouterr()
    assert code in (0, None)
    assert len(path.read_text().splitlines()) == json.loads(out)["requests"]


def test_a_file_of_another_kind_is_a_user_error(tmp_path, capsys):
    with pytest.raises(UserError, match="csv or .jsonl"):
        RequestsOut(tmp_path / "rows.parquet")
    code = main(["simulate", "--duration", "5", "--quiet", "--requests-out", str(tmp_path / "x" / "r.csv")])
    _, err = capsys.readouterr()
    assert code == 2 and "error: --requests-out" in err and "cannot write" in err
