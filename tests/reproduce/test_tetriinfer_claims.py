"""TetriInfer's claims table and counterfactuals (issue 27 item 3) at the tiny scale, with the roofline
run beside: both columns are filled, each claim's figures are results.json's (this run's and the
roofline run's), and a counterfactual row is what a fresh simulation of its setting gives."""

import json

from splitserve.reproduce.tetriinfer import run_tetriinfer
from splitserve.reproduce.tetriinfer_claims import _options, claims, v100_kv
from splitserve.reproduce.tetriinfer_experiments import TINY, compare, paper


def _rows(text: str, title: str) -> list[list[str]]:
    part = text.split(title, 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in part.splitlines()
            if line.startswith("| ") and not line.startswith("| ---")][1:]


def test_claims_and_counterfactuals(tmp_path):
    path = run_tetriinfer(tmp_path, scale="tiny", log=lambda m: None, versus_roofline=True)
    text = path.read_text()
    res = json.loads((tmp_path / "results.json").read_text())
    roof = json.loads((tmp_path / "roofline" / "results.json").read_text())
    assert res["perf_model"] == "auto" and roof["perf_model"] == "roofline"
    assert "counterfactuals" in res and "counterfactuals" not in roof      # the roofline run: claims only
    assert "| claim | paper | ours (roofline) | ours (operators) | why |" in text
    rows = {r[0]: r for r in _rows(text, "## Claims")}
    pub = paper()
    ours, theirs = claims(res, pub), {c.key: c for c in claims(roof, pub)}
    assert len(ours) == len(rows) == 8              # LPLD and LPHD: TTFT, JCT, resource, perf/$
    for c in ours:
        w, key = c.key.split(" ")
        m = next(m for m in res["main"] if m["workload"] == w and m["link"] == "roce")
        r = next(m for m in roof["main"] if m["workload"] == w and m["link"] == "roce")
        assert c.ours == m[key] and theirs[c.key].ours == r[key]
        assert rows[c.text][2] == c.fmt.format(r[key]) and rows[c.text][3] == c.fmt.format(m[key])
        assert rows[c.text][4] and "not run" not in rows[c.text]
    # a counterfactual row is its own simulations: rerun V100 KV on LPHD
    assert res["counterfactuals"]["v100_kv_tokens"] == v100_kv()[0] and 5_000 < v100_kv()[0] < 7_000
    run = next(r for r in res["counterfactuals"]["runs"] if r["variant"] == "v100-kv" and r["workload"] == "lphd")
    again = compare("lphd", TINY, "roce", None, seeds=tuple(res["counterfactuals"]["seeds"]), **_options("v100-kv"))
    assert run["jct_cut"] == again["jct_cut"] and run["perf_per_dollar"] == again["perf_per_dollar"]
    cf = {(r[0], r[1]): r for r in _rows(text, "## Counterfactuals")}
    assert cf[("LPHD", "V100-32GB's KV")][3] == f"{100 * run['jct_cut']:+.0f}%"
    assert cf[("LPHD", "V100-32GB's KV")][5] == f"{run['perf_per_dollar']:.2f}x"
    # the as-run row on the same seeds is the main table's (tiny: one seed, the same one)
    base = next(r for r in res["counterfactuals"]["runs"] if r["variant"] == "as-run" and r["workload"] == "lphd")
    main = next(m for m in res["main"] if m["workload"] == "lphd")
    assert base["jct_cut"] == main["jct_cut"]
