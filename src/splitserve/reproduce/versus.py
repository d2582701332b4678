"""A paper's claims beside ours under two step-time models: the table every reproduction report
opens with. Each report module turns its results.json into `Claim`s; run once
with the default model (the operator model off the Splitwise grid) and once with
`--perf-model roofline`, the two lists meet here, and each claim's `why` names the run (a
counterfactual in the same report) that explains the gap, or says plainly that none does yet."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .markdown import Report, table_row


@dataclass(frozen=True)
class Claim:
    key: str              # stable id, the same in both runs (e.g. "chatbot-opt-13b rate gain")
    text: str             # what is claimed, in a few words
    paper: str            # the paper's figure, as printed ("2-3.41x", "38% less")
    ours: float | None    # our figure for the same quantity (None: not reached / not run)
    fmt: str = "{:.2f}"   # how `ours` prints
    why: str = ""         # the cause of the gap, naming the run that shows it


def roofline_results(out: Path) -> dict | None:
    """results.json of the roofline run beside this one (OUT/roofline/), None when there is none."""
    path = Path(out) / "roofline" / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def claims_table(ours: list[Claim], roofline: list[Claim] | None, model_name: str) -> list[str]:
    """Markdown lines: claim | paper | ours (roofline) | ours (<model_name>) | why."""
    roof = {c.key: c for c in roofline or []}
    rows = []
    for c in ours:
        r = roof.get(c.key)
        rows.append([c.text, c.paper, _fmt(r) if r is not None else "not run", _fmt(c), c.why or "not explained yet"])
    header = ["claim", "paper", "ours (roofline)", f"ours ({model_name})", "why"]
    return [table_row(header), table_row(["---"] * len(header)), *(table_row(r) for r in rows), ""]


def claims_section(rep: Report, ours: list[Claim], roofline: list[Claim] | None, res: dict, note: str = "") -> None:
    """A report's opening section: the claims table, its model column named for the run's
    `perf_model`, and what its columns are (plus `note`)."""
    rep.add("## Claims: the paper, ours under the roofline, ours under the operator model", "")
    model = "operators" if res.get("perf_model") in ("auto", "operators") else res.get("perf_model", "auto")
    rep.add(*claims_table(ours, roofline, model))
    rep.add("The roofline column is `--perf-model roofline`'s run (roofline/results.json, its report beside it); "
            "without `--versus-roofline` it reads 'not run'. Each 'why' is filled from this run's counterfactual "
            "runs (section Counterfactuals)." + note, "")


def _fmt(c: Claim) -> str:
    return "n/a" if c.ours is None else c.fmt.format(c.ours)


def run_both(run, out: Path, perf_model: str, versus_roofline: bool, log=print) -> Path:
    """`run(out, perf_model) -> report path`, first under the roofline into OUT/roofline/ when
    `versus_roofline` (its report sits there; this one's claims table reads its results.json)."""
    if versus_roofline and perf_model != "roofline":
        log("the roofline run first, into roofline/ (--versus-roofline)")
        run(Path(out) / "roofline", "roofline")
    return run(Path(out), perf_model)
