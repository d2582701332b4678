"""What `splitserve provision` prints and writes of a search's answer: the table, the line when no
design meets the SLOs, provision.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from . import plan


def _slos(sc: dict) -> str:
    """What the SLO is: the nine slowdowns, or DistServe's attainment of the goodput SLOs."""
    g = sc.get("goodput")
    return f"the goodput SLOs (90% within TTFT {g[0]:g} s, TPOT {g[1]:g} s)" if g else "all nine SLOs"


def infeasible_message(res: dict) -> str:
    lim = res["limits"]
    what = (f"at {res['rps']:g} req/s" if res["rps"] and res["objective"] != "batch"
            else f"within the budget {res['budget']}")
    msg = (f"no design meets {_slos(res['scenario'])} {what} with up to {lim['max_prompt']} prompt x "
           f"{lim['max_token']} token machines ({lim['max_machines']} for baselines)")
    c = res.get("closest")
    if c:
        if c["worst_check"] == "goodput_attainment":  # worst_ratio = target / attainment
            attained = 0.9 / c["worst_ratio"] if c["worst_ratio"] else 1.0
            msg += f"; closest: {config_label(c)}, {attained:.0%} of whose requests attain both (target 90%)."
        else:
            check = c["worst_check"].replace("_", " ").upper()
            msg += f"; closest: {config_label(c)}, whose {check} slowdown is {c['worst_ratio']:.2f}x its limit."
        msg += " Raise --max-prompt/--max-token/--max-machines or lower --rps."
    return msg


def config_label(r: dict) -> str:
    if "machines" in r:
        return f"{r['design']} with {r['machines']} machines"
    return f"{r['design']} with {r['prompt_machines']}P + {r['token_machines']}T"


def print_result(res: dict) -> None:
    from rich.console import Console

    con = Console(width=None if sys.stdout.isatty() else 140)
    obj = res["objective"]
    con.print(_designs_table(res))
    s = res["search"]
    how = ("every largest split within the budget simulated" if obj == "batch" else
           f"exact under the assumption that {res['assumption'].split(';')[0]}")
    con.print(f"[dim]{s['simulated']} simulations ({s['cached']} answered from the cache) against "
              f"{s['brute_force']:,} for brute force; {s['wall_s']:.1f} s on {s['workers']} "
              f"{s['backend']} workers; {how}.[/]")
    if res["best"] is None:
        con.print(f"[red]{infeasible_message(res)}[/]")
    else:
        b = res["best"]
        con.print(f"best: [bold]{config_label(b)}[/], ${b['cost_per_hour']:,.0f}/h, {b['power_kw']:,.1f} kW")


def _designs_table(res: dict):
    """A row for each design searched (the best starred, the infeasible dimmed), its columns the
    objective's."""
    from rich.table import Table

    obj = res["objective"]
    head = (f"least {obj} meeting {_slos(res['scenario'])} at {res['rps']:g} req/s" if obj in plan.OBJECTIVES
            else f"highest throughput at SLO within {res['budget']} ({res['constraint']})" if obj == "throughput"
            else f"most requests per dollar under stress within {res['budget']} ({res['constraint']})")
    sc = res["scenario"]
    tab = Table(title=f"{head} | {sc['model']} | {sc['workload']} ({sc['duration']:g} s, seed {sc['seed']})"
                      + (f" | policy {sc['system']}" if sc.get("system") else ""),
                title_justify="left")
    for col in ("design", "prompt", "token", "machines", "$/h", "kW"):
        tab.add_column(col, justify="left" if col == "design" else "right")
    if obj == "throughput":
        tab.add_column("req/s at SLO", justify="right")
    if obj == "batch":
        tab.add_column("req/s", justify="right")
        tab.add_column("req per $", justify="right")
    tab.add_column("worst check", justify="right")
    tab.add_column("sims", justify="right")
    for r in res["designs"]:
        tab.add_row(*_design_cells(r, obj, r is res["best"]))
    return tab


def _design_cells(r: dict, obj: str, best: bool) -> list[str]:
    """One design's row of the table."""
    ok = r.get("feasible")
    split = "prompt_machines" in r
    cells = [("* " if best else "  ") + r["design"],
             str(r.get("prompt_machines", "-")) if split else "-",
             str(r.get("token_machines", "-")) if split else "-",
             str(r.get("machine_count", r.get("machines", "-")))]
    if "cost_per_hour" in r:
        cells += [f"{r['cost_per_hour']:,.0f}", f"{r['power_kw']:,.1f}"]
    else:
        cells += ["-", "-"]
    if obj == "throughput":
        cells.append(f"{r['throughput_at_slo']:g}" if r.get("throughput_at_slo") else "-")
    if obj == "batch":
        cells += [f"{r['throughput_rps']:.1f}" if ok else "-",
                  f"{r['requests_per_dollar']:.1f}" if ok else "-"]
    if obj == "batch":
        cells.append("no SLO" if ok else r.get("reason", "-"))
    elif r.get("worst_check"):
        mark = "" if r.get("slo_met") else " [red]MISS[/]"
        cells.append(f"{r['worst_check']} {r['worst_ratio']:.2f}x{mark}")
    else:
        cells.append(r.get("reason", "-"))
    cells.append(str(r.get("simulations", 0)))
    if not ok:
        cells[0] = f"[dim]{cells[0]} (infeasible)[/]"
    return cells


def write_result(res: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "provision.json"
    path.write_text(json.dumps(res, indent=2) + "\n")
    return path
