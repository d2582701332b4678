"""The claims' paragraphs come from the run: claims.toml's templates name only figures that
compare/facts.py knows (a typo fails), conditions pick sentences by the run's figures, and two runs
on two budgets give two paragraphs whose every figure is that run's (results.json)."""

import json
import re

import pytest

from splitserve.compare import explain, facts
from splitserve.compare.claims import load_claims, parse_claims
from splitserve.compare.command import run_compare
from splitserve.compare.request import CompareRequest
from splitserve.policy.systems import SYSTEMS

NUMBER = re.compile(r"(?<![A-Za-z\d.,])\d+(?:,\d{3})*(?:\.\d+)?")     # not the 99 of P99


def test_every_name_in_claims_toml_is_a_figure_the_filler_knows():
    claims = load_claims()
    names = facts.known()
    seen = 0
    for c in claims.values():
        for w, sentences in c.why.items():
            for s in sentences:
                assert explain.problems(s) == [], (c.system, w, s.text)
                for t in (s.text, s.otherwise):
                    for n in explain.PLACEHOLDER.findall(t):
                        assert n in names
                        seen += 1
    assert seen > 100                          # the paragraphs are templates, not prose with numbers
    assert set(claims) == set(SYSTEMS)


# numbers a template may print that are no run's: the paper's (besides those of its claim's lines)
# and the comparison's settings
ALLOWED = {"20": "the 'within 20% of the claim' band its condition tests",
           "512": "Sarathi-Serve's and TetriInfer's chunk (policy/schedulers/)",
           "40": "Splitwise's 40-machine iso-power design (§VI-B)", "8": "tp-8 machines (compare's setup)",
           "70": "Llama-2-70B", "13": "OPT-13B"}


def _stray_literals(claims) -> list[tuple[str, str]]:
    out = []
    for c in claims.values():
        paper = set(NUMBER.findall(" ".join([c.claim, c.paper, c.section, c.baseline_note, c.metric, str(c.gain)])))
        for sentences in c.why.values():
            for s in sentences:
                for t in (s.text, s.otherwise):
                    out += [(c.system, x) for x in NUMBER.findall(explain.PLACEHOLDER.sub("", t))
                            if x not in paper and x not in ALLOWED]
    return out


def test_templates_print_no_figure_of_a_run():
    assert _stray_literals(load_claims()) == []
    bad = parse_claims('[vllm]\npaper = "p"\nsection = "s"\nclaim = "2-4x"\npaper_baseline = "b"\nbaseline = ""\n'
                       'baseline_note = ""\nmetric = "m"\n[[vllm.why.coding]]\n'
                       'text = "It carries 11.2 req/s, 2x the rest, ({goodput_rps} req/s here)."\n')
    assert _stray_literals(bad) == [("vllm", "11.2")]        # "2" is the claim's own


@pytest.mark.parametrize("bad, msg", [
    ("{goodput_rsp}", "unknown figure {goodput_rsp}"),           # a typo of a figure
    ("{vs.vlm}", "unknown figure {vs.vlm}"),                       # a typo of a system
    ("{goodput_rps", "unmatched brace"),
])
def test_a_typo_in_a_template_fails_loading(bad, msg):
    text = f'[vllm]\npaper = "p"\nsection = "s"\nclaim = "c"\npaper_baseline = "b"\nbaseline = ""\n' \
           f'baseline_note = ""\nmetric = "m"\n[[vllm.why.coding]]\ntext = "It carries {bad} req/s."\n'
    with pytest.raises(ValueError, match=re.escape(msg)):
        parse_claims(text)


@pytest.mark.parametrize("when, msg", [
    ('["rnak == 1"]', "unknown figure 'rnak'"),
    ('["rank == sytems"]', "unknown figure 'sytems'"),
    ('["rank = 1"]', "is not 'a OP b'"),
    ("[\"limit_kind < 'tbt'\"]", "a word compares with == or != only"),
    ('["limit_kind == 1"]', "compares a word with a number"),
])
def test_a_bad_condition_fails_loading(when, msg):
    text = f'[vllm]\npaper = "p"\nsection = "s"\nclaim = "c"\npaper_baseline = "b"\nbaseline = ""\n' \
           f'baseline_note = ""\nmetric = "m"\n[[vllm.why.coding]]\nwhen = {when}\ntext = "x"\n'
    with pytest.raises(ValueError, match=re.escape(msg)):
        parse_claims(text)


def test_conditions_pick_the_sentence_and_a_missing_figure_drops_it():
    f = {"rank": 1, "systems": 3, "goodput_rps": 12.345, "limit_kind": "tbt", "vs.vllm": 2.0}
    s = [explain.Sentence("Best at {goodput_rps} req/s.", ("rank == 1",), "Rank {rank}."),
         explain.Sentence("Bound by TBT.", ("limit_kind == 'tbt'",)),
         explain.Sentence("Not TTFT.", ("limit_kind == 'ttft'",)),
         explain.Sentence("{vs.vllm}x vLLM, {vs.sarathi}x sarathi."),            # sarathi not run: left out
         explain.Sentence("Least.", ("rank == systems",), "Not least ({rank} of {systems}).")]
    assert explain.paragraph(s, f) == "Best at 12.35 req/s. Bound by TBT. Not least (1 of 3)."
    assert explain.paragraph(s, {**f, "rank": 3}) == "Rank 3. Bound by TBT. Least."
    assert explain.paragraph(s[:1], {"rank": 1}) == ""                        # its figure missing


# two budgets, small and fast (as test_compare.py's TINY), no latency curves
QUICK = dict(duration=20.0, tolerance=0.1, curve_points=0, workers=2, use_cache=False)


@pytest.fixture(scope="module")
def two_budgets(tmp_path_factory):
    runs = {}
    for n in (3, 5):
        out = tmp_path_factory.mktemp(f"budget{n}")
        run_compare(CompareRequest(out=out, command=f"compare -n {n} (test)", machines=n, **QUICK))
        runs[n] = out, json.loads((out / "results.json").read_text())
    return runs


def _candidates(res: dict) -> set[str]:
    """Every way a figure of this run's results.json can be written in a paragraph: each number in
    it in the formats facts.py uses (ms, %, counts), and the ratios of each pair of goodputs, costs
    and P50 TTFTs, computed here from results.json alone."""
    nums: list[float] = []

    def walk(x):
        if isinstance(x, bool):
            return
        if isinstance(x, (int, float)):
            nums.append(float(x))
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk({k: res[k] for k in ("systems", "reference", "workload_stats", "budget")})
    rows = [r for r in res["systems"] + [res["reference"]] if r["goodput_rps"]]
    for a in rows:
        nums.append(a["goodput_rps"] / sum(a["cluster"]))
        for b in rows:
            ga, gb = a["goodput_rps"], b["goodput_rps"]
            ma, mb = a["at_goodput"], b["at_goodput"]
            nums += [ga / gb, 100 * (1 - gb / ga), ma["ttft_p50_s"] / mb["ttft_p50_s"],
                     ma["cost_per_m_output_tokens"] / mb["cost_per_m_output_tokens"]]
    out = {str(len(res["systems"]))}
    for x in nums:
        for v, fmts in ((x, (".4g", ".2f", ".1f", ",.0f", "g")), (x * 1e3, (",.0f",)), (x * 100, (".0f", ".1f"))):
            out |= {format(v, f) for f in fmts}
    return out


def test_two_budgets_give_two_paragraphs_each_with_its_own_runs_figures(two_budgets):
    claims = load_claims()
    (out3, a), (out5, b) = two_budgets[3], two_budgets[5]
    for res, out, n in ((a, out3, 3), (b, out5, 5)):
        report = (out / "report.md").read_text()
        cands = _candidates(res)
        for r in res["systems"]:
            why, m = r["why"], r["at_goodput"]
            assert why and "{" not in why and "}" not in why, r["system"]
            assert why in report                                     # the report prints it
            # the figures the paragraph quotes, computed here from results.json
            assert f"{r['goodput_rps']:.4g} req/s" in why, (r["system"], why)
            assert f"{m['worst_ratio']:.2f} of its {m['worst_limit']:g}x limit at goodput" in why
            if r["finding"]["ours"] is not None:
                assert f"{r['finding']['ours']:.2f}x vLLM" in why
            # every other number is the run's or the template's own (the paper's, a setting)
            literal = {x for s in claims[r["system"]].why["coding"] for t in (s.text, s.otherwise)
                       for x in NUMBER.findall(explain.PLACEHOLDER.sub("", t))}
            stray = [x for x in NUMBER.findall(why) if x not in literal and x not in cands]
            assert stray == [], (r["system"], stray, why)
        vllm = next(r for r in res["systems"] if r["system"] == "vllm")
        assert f"On {n} dgx-h100 machines it carries {vllm['goodput_rps']:.4g} req/s" in vllm["why"]
        assert f"(P50 {vllm['at_goodput']['ttft_p50_s'] * 1e3:,.0f} ms)" in vllm["why"] or \
            f"P50 TTFT is {vllm['at_goodput']['ttft_p50_s'] * 1e3:,.0f} ms" in vllm["why"]
        sw = next(r for r in res["systems"] if r["system"] == "splitwise")
        ref = res["reference"]
        assert f"{sw['goodput_rps'] / ref['goodput_rps']:.2f}x the paper's own kind of baseline" in sw["why"]
        assert f"this run's reference, {ref['goodput_rps']:.4g} req/s" in sw["why"]
        # the sentence chosen by a comparison of this run's figures
        assert ("That is more than the paper's 2.35x." in sw["why"]) == (sw["goodput_rps"] / ref["goodput_rps"] > 2.35)
    # a bigger budget carries more: every system's goodput, and so its paragraph, changes
    for ra, rb in zip(a["systems"], b["systems"]):
        assert rb["goodput_rps"] > ra["goodput_rps"], ra["system"]
        assert ra["why"] != rb["why"], ra["system"]
