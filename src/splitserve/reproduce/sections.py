"""The sections of the Splitwise reproduction report, one function each: our figures from the
simulator beside the paper's, with a note for each difference of more than 10%."""

from __future__ import annotations

from ..provision import plan
from . import plots
from .markdown import Report, ratio_cell


def table4(rep: Report, data: dict, pub: dict) -> None:
    rep.add("## Isolated requests (Table IV)", "",
            "A P50 coding request (1,500 prompt / 13 output tokens) and a P50 conversation request "
            "(1,020 / 129) alone on one machine. Cost is per 100 such requests at the machine's "
            "$/hour, and energy is the machine's GPU energy for one request.", "")
    rows = []
    for kind in ("coding", "conversation"):
        for metric, unit in (("ttft_ms", "ms"), ("tbt_ms", "ms"), ("e2e_ms", "ms"),
                             ("cost_per_100", "$"), ("energy_wh", "Wh")):
            a, h = data[kind]["a100"][metric], data[kind]["h100"][metric]
            pa, ph = pub[kind]["a100"][metric], pub[kind]["h100"][metric]
            rows.append([kind, f"{metric.rsplit('_', 1)[0].upper()} ({unit})", f"{a:.3g}", f"{pa:g}",
                         ratio_cell(a, pa), f"{h:.3g}", f"{ph:g}", ratio_cell(h, ph),
                         f"{h / a:.2f}", f"{ph / pa:.2f}"])
    rep.table(["workload", "metric", "A100 ours", "A100 paper", "ratio", "H100 ours", "H100 paper",
               "ratio", "H100/A100 ours", "H100/A100 paper"], rows)
    rep.add("Where ours and the paper's differ by more than 10%, and why:", "")
    for kind in ("coding", "conversation"):
        for hw in ("a100", "h100"):
            d, p = data[kind][hw], pub[kind][hw]
            rep.explain(f"{kind} {hw.upper()} TTFT", d["ttft_ms"], p["ttft_ms"],
                        "Our TTFT is the published profile's prompt time (tensor parallel 8), which "
                        "is not what Table IV measured: its TTFT and TBT differ from the profile's "
                        "own points at the same sizes.")
            rep.explain(f"{kind} {hw.upper()} TBT", d["tbt_ms"], p["tbt_ms"],
                        "Our TBT is the profile's batch-1 decode time; Table IV's coding TBT (52 ms "
                        "A100) is above the profile's ~45 ms at any context.")
            rep.explain(f"{kind} {hw.upper()} energy", d["energy_wh"], p["energy_wh"],
                        "We count GPU power only (the paper provisions by GPU TDP; Table IV's energy "
                        "implies whole-machine power of 5.8-10 kW).")
    rep.add("")


def _grid_vs_search(best: tuple[int, int], found: dict) -> str:
    """What the exact search says of the grid's cheapest cell (both from this run)."""
    if not found.get("feasible"):
        return ("The exact search below found no split up to 70 x 70 that meets all nine SLOs on its "
                "trace, so it cannot tell whether a finer grid would do better.")
    n, g = found["prompt_machines"] + found["token_machines"], best[0] + best[1]
    same = (found["prompt_machines"], found["token_machines"]) == tuple(best)
    return (f"Not the grid's resolution: the exact search below, over every split up to 70 x 70, finds "
            f"{_split(found)} ({n} machines)"
            + (", the grid's own cell" if same else f" against the grid's {g}")
            + "; see its note for what we know of the rest.")


def heatmap(rep: Report, data: dict, pub: dict, found: dict) -> None:
    fp = pub["fig12"]
    plots.heatmap(data, rep.out / "fig12_heatmap.png", (fp["prompt_machines"], fp["token_machines"]))
    best = data["best"]
    rep.add("## Design space of Splitwise-HH at 70 req/s of coding (Fig. 12)", "",
            "![Fig. 12](fig12_heatmap.png)", "")
    if best:
        ours = best[0] + best[1]
        theirs = fp["prompt_machines"] + fp["token_machines"]
        rep.table(["", "prompt machines", "token machines", "machines (cost)"],
                  [["ours (cheapest in the grid that meets all nine SLOs)", best[0], best[1], ours],
                   ["paper (Fig. 12)", fp["prompt_machines"], fp["token_machines"], theirs]])
        rep.explain("machines of the cost-optimal HH cluster", ours, theirs, _grid_vs_search(best, found))
    else:
        rep.add("No cluster in the grid met all nine SLOs.")
    rep.add("")


def _split(r: dict) -> str:
    return f"{r['machines']}" if "machines" in r else f"{r['prompt_machines']}P + {r['token_machines']}T"


BASELINE_NOTE = ("Our unsplit baselines are probably weaker than the paper's: with mixed batching a "
                 "1,000-1,500-token prompt stalls every decode in its batch for a whole prompt "
                 "time, and the P50/P90 TBT and E2E SLOs (1.25x/1.5x) then fail at a lower load "
                 "per machine than in the paper, so Splitwise's advantage comes out larger.")


def _limited(d: str, r: dict) -> str:
    return (f"At its best split our {d} is held back by its {r['worst_check'].replace('_', ' ').upper()} "
            f"SLO ({r['worst_ratio']:.2f}x of the limit); the paper does not say which SLO binds its "
            "clusters, so we cannot tell where the two models part.")


def fig12_search(rep: Report, found: dict, heat: dict, pub: dict) -> None:
    fp = pub["fig12"]
    rep.add("### The exact optimum, by search", "",
            f"`splitserve provision --objective cost --rps 70 --design splitwise-hh` over up to 70 x 70 "
            f"splits, on the same {heat.get('duration', '')} trace as the grid above:", "")
    grid = heat["best"]
    rows = [["search (exact over 70 x 70)", _split(found) if found["feasible"] else "none",
             f"{found['simulations']} of {found['brute_force']:,}"]]
    if grid:
        rows.append(["grid above (cheapest cell)", f"{grid[0]}P + {grid[1]}T", f"{len(heat['cells'])}"])
    rows.append(["paper (Fig. 12, 69 x 69 sweep)", f"{fp['prompt_machines']}P + {fp['token_machines']}T", "4,761"])
    rep.table(["", "cost-optimal split", "simulations"], rows)
    if found["feasible"]:
        rep.explain("machines of the searched optimum", found["prompt_machines"] + found["token_machines"],
                    fp["prompt_machines"] + fp["token_machines"],
                    "The TTFT SLOs are slowdowns against an uncontended A100, which an H100 beats "
                    "by about 2x (Table IV), so our H100 prompt machines can queue a lot before "
                    "they miss; why the paper's need twice as many we have not pinned down "
                    "(candidates: its 2023 trace sample against our fitted sizes, and its KV "
                    "sizing without grouped-query attention, which fills machines sooner).")
    rep.add("")


def _cost_of(design: str, split: list[int]) -> float:
    per = plan.unit_values(plan.design(design), lambda hw: hw.cost_per_hour)
    return sum(n * c for n, c in zip(split, per))


def throughput_optimised(rep: Report, data: dict, title: str, fig: str, png: str, baseline: str,
                         claims: dict, pub_splits: dict | None = None, at_paper: dict | None = None) -> None:
    """One summary figure: each design's cluster, its throughput at SLO against both baselines,
    and each of the paper's claims (`claims`: design -> the baseline it is read against, its
    throughput ratio and cost ratio) beside ours; `at_paper`: design -> req/s at SLO of the
    paper's own split (`pub_splits`), run to tell a different split from a different model."""
    plots.summary_bars(data, baseline, [("throughput_at_slo", "throughput at SLO"),
                                         ("cost_per_hour", "cost"), ("power_kw", "power"),
                                         ("machine_count", "machines")], rep.out / png, title)
    rep.add(f"## {title} ({fig})", "", f"![{fig}]({png})", "")
    bases = {b: data.get(b, {}).get("throughput_at_slo") for b in ("baseline-a100", "baseline-h100")}
    rows = []
    for d, r in data.items():
        if not r.get("feasible"):
            rows.append([d, "-", "-", "-", "none", "-", "-", "-", "-", "-"])
            continue
        thr = r["throughput_at_slo"]
        vs = [f"{thr / b:.2f}" if b else "-" for b in bases.values()]
        ps = pub_splits.get(d) if pub_splits else None
        c = claims.get(d)
        paper = ours_paper = "-"
        if c and bases.get(c["baseline"]):
            base = data[c["baseline"]]
            ratio, cost = thr / bases[c["baseline"]], r["cost_per_hour"] / base["cost_per_hour"]
            paper = f"{c['throughput']:g}x req/s" + (f", {c['cost']:.2f}x $/h" if "cost" in c else "") + \
                f" (vs {c['baseline']})"
            ours_paper = f"{ratio_cell(ratio, c['throughput'])} req/s" + (f", {ratio_cell(cost, c['cost'])} $/h" if "cost" in c else "")
            _why_claim(rep, d, r, c, ratio, cost, ps, at_paper, bases)
        rows.append([d, _split(r), "+".join(map(str, ps)) if ps else "-", f"{r['power_kw']:.0f}",
                     f"{r['cost_per_hour']:,.0f}", f"{thr:.1f}", *vs, paper, ours_paper])
    rep.table(["design", "split (ours)", "split (paper)", "power (kW)", "cost ($/h)", "req/s at SLO",
               "vs baseline-a100", "vs baseline-h100", "paper", "ours / paper"], rows)
    for d, c in claims.items():
        if pub_splits and d in pub_splits and c["baseline"] == "baseline-h100":
            paid = _cost_of(d, pub_splits[d])
            a100, h100 = _cost_of("baseline-a100", [70]), _cost_of("baseline-h100", [40])
            rep.add(f"The paper reads {d}'s claim against {c['baseline']}: its split "
                    f"({'+'.join(map(str, pub_splits[d]))}) costs ${paid:,.0f}/h, {paid / a100:.2f}x "
                    f"Baseline-A100's (70 machines, ${a100:,.0f}/h) and {paid / h100:.2f}x Baseline-H100's "
                    f"(40, ${h100:,.0f}/h), so \"{1 - c['cost']:.0%} lower cost\" can only be against "
                    "Baseline-H100 (its text names Baseline-A100 as the figure's baseline, which fits "
                    "only the AA claim).", "")


def _why_claim(rep: Report, d: str, r: dict, c: dict, ratio: float, cost: float, ps, at_paper, bases) -> None:
    b = c["baseline"]
    if at_paper and d in at_paper and at_paper[d] and bases.get(b):
        alt = at_paper[d] / bases[b]
        why = (f"At the paper's own split ({'+'.join(map(str, ps))}) our {d} serves {at_paper[d]:.1f} req/s, "
               f"{alt:.2f}x {b} ({ratio_cell(alt, c['throughput'])}x the paper's {c['throughput']:g}x): "
               + ("so the split, not the model, makes most of the difference; our search's "
                  f"{_split(r)} serves more" if abs(alt / c["throughput"] - 1) < abs(ratio / c["throughput"] - 1)
                  else "the paper's split does no closer, so the difference is in the model, not the split") + ".")
    else:
        why = BASELINE_NOTE if ratio > c["throughput"] else _limited(d, r)
    rep.explain(f"{d} throughput vs {b}", ratio, c["throughput"], why)
    if "cost" in c:
        rep.explain(f"{d} cost vs {b}", cost, c["cost"],
                    f"Our {d} split ({_split(r)}) has a different mix of machines than the paper's.")


def iso_throughput(rep: Report, power: dict, cost: dict, rps: float, pub: dict, png: str,
                   max_pool: int) -> None:
    rep.add("## Iso-throughput power- and cost-optimised clusters (Fig. 19)", "",
            f"Each design's cluster with the least power (a) and the least cost (b) that meets all "
            f"nine SLOs at {rps:.1f} req/s of conversation, Baseline-H100's throughput at SLO "
            f"within the iso-power budget above; up to {max_pool} machines per pool "
            f"({2 * max_pool} for baselines).", "", f"![Fig. 19]({png})", "")
    merged = {d: {**cost[d], "power_opt_kw": power[d].get("power_kw")} for d in cost}
    plots.summary_bars(merged, "baseline-h100", [("power_opt_kw", "power (power-optimised)"),
                                                 ("cost_per_hour", "cost (cost-optimised)"),
                                                 ("machine_count", "machines (cost-optimised)")],
                       rep.out / png, f"Iso-throughput ({rps:.1f} req/s), relative to baseline-h100")
    bp, bc = power["baseline-h100"].get("power_kw"), cost["baseline-h100"].get("cost_per_hour")
    targets = {("splitwise-hhcap", "power"): pub["power_hhcap_vs_baseline_h100"],
               ("splitwise-aa", "cost"): pub["cost_aa_vs_baseline_h100"]}
    rows = []
    for d in cost:
        pr, cr = power[d], cost[d]
        if not (pr.get("feasible") and cr.get("feasible")):
            rows.append([d, "infeasible", "-", "-", "-", "-", "-"])
            continue
        rp = pr["power_kw"] / bp if bp else None
        rc = cr["cost_per_hour"] / bc if bc else None
        paper = [f"power {targets[(d, 'power')]:g}" if (d, "power") in targets else "",
                 f"cost {targets[(d, 'cost')]:g}" if (d, "cost") in targets else ""]
        rows.append([d, _split(pr), f"{pr['power_kw']:.0f} ({rp:.2f})", _split(cr),
                     f"{cr['cost_per_hour']:,.0f} ({rc:.2f})", " ".join(x for x in paper if x) or "-",
                     f"{pr['simulations'] + cr['simulations']}"])
        for (name, kind), p in targets.items():
            if name == d:
                ours = rp if kind == "power" else rc
                assert ours is not None, "the baseline's power and cost are positive"
                rep.explain(f"{d} {kind} vs baseline-h100", ours, p,
                            BASELINE_NOTE if ours < p else _limited(d, pr if kind == "power" else cr))
    rep.table(["design", "power-optimised split", "kW (vs baseline-h100)", "cost-optimised split",
               "$/h (vs baseline-h100)", "paper", "simulations"], rows)


def load_sweep(rep: Report, data: dict, workload: str, clusters: dict) -> None:
    name = f"fig16_{workload}.png"
    plots.load_curves(data, rep.out / name,
                      f"Iso-power clusters, {workload}: SLO slowdowns against load")
    rep.add(f"## Latency against load, iso-power clusters, {workload} (Fig. 16)", "",
            f"![Fig. 16 {workload}]({name})", "")
    rows = []
    for d, points in data.items():
        ok = [p["rps"] for p in points if p["slo_met"]]
        split = clusters[d]
        rows.append([d, "+".join(f"{n}{'PT'[i] if len(split) == 2 else ''}" for i, n in enumerate(split)),
                     f"{points[0]['power_kw']:.0f}", f"{points[0]['cost']:,.0f}",
                     max(ok) if ok else "none"])
    rep.table(["design", "machines", "power (kW)", "cost ($/h)", "highest load meeting all SLOs (req/s)"], rows)


def batch_job(rep: Report, data: dict, pub: dict) -> None:
    pb = pub["batch_job"]["rps_per_dollar"]
    rep.add("## Batch jobs: throughput per cost under stress (§VI-E)", "",
            "Each iso-power coding cluster from Fig. 16 is offered 400 req/s, far more than it can "
            "serve. Its throughput is the requests offered divided by the time until the last one "
            "completes. Cost is counted in DGX-A100 machine-hours ($17.6), the only unit in which the "
            "paper's \"RPS/$\" figures are plausible (Table V normalises cost to a DGX-A100).", "")
    rows = []
    for d, r in data.items():
        p = pb.get(d)
        rows.append([d, f"{r['throughput_rps']:.1f}", f"{r['cost']:,.0f}", f"{r['rps_per_a100_hour']:.2f}",
                     f"{p:g}" if p else "-", ratio_cell(r["rps_per_a100_hour"], p) if p else "-"])
    rep.table(["design", "throughput (req/s)", "cost ($/h)", "req/s per A100-hour ours", "paper", "ratio"], rows)
    for d, r in data.items():
        if d in pb:
            rep.explain(f"{d} throughput per A100-hour", r["rps_per_a100_hour"], pb[d],
                        "Our Llama2-70B KV cache is sized for its 8 KV heads (GQA), so under stress "
                        "each machine batches hundreds of decodes; the paper's clusters run out of "
                        "KV memory near batch 64 (Fig. 6b), which caps their throughput.")
    splits = [d for d in data if d.startswith("splitwise")]
    for d in splits:
        base = "baseline-a100" if d.endswith("aa") else "baseline-h100"
        if base in data:
            rep.add(f"- {d} serves {data[d]['throughput_rps'] / data[base]['throughput_rps']:.2f}x "
                    f"the throughput of {base} under stress: the paper observes that at high load "
                    "Splitwise devolves into the baseline, with every machine in the mixed pool.")
    rep.add("")
