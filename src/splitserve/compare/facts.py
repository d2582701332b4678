"""The figures a claim's paragraph may quote, by name, every one from one run's results (the dict
results.json holds): each system's goodput, split, latencies, cost and binding SLO check at
goodput, how busy its pools were and the most KV a machine held, its ratios to the other systems
and to the run's reference (ref_*: the same machines unsplit under the default policy, Splitwise's
mixed-batching baseline), and the sizes of the requests simulated.
compare/explain.py fills compare/claims.toml's templates with them.

A paragraph names its own system's figures bare ({goodput_rps}), another system's with its name
({distserve.goodput_rps}), and ratios of its goodput or cost to another's as {vs.distserve} and
{cost_vs.distserve}. A figure the run does not have (a system not compared, no goodput, a pool the
design lacks) is absent from the facts, never zero.
"""

from __future__ import annotations

from typing import Any

from ..policy.systems import SYSTEMS

# name -> format spec (format(); "s": a word as it is)
SYSTEM: dict[str, str] = {
    "goodput_rps": ".4g", "split": "s", "prompt_machines": "d", "token_machines": "d",
    "rps_per_machine": ".2f", "baseline": "s", "vs_baseline": ".2f", "vs_best": ".2f", "vs_ref": ".2f",
    "rank": "d", "cost_rank": "d", "cost_per_mtok": ",.0f", "cost_vs_cheapest": ".1f",
    "ttft_p50_ms": ",.0f", "ttft_p99_ms": ",.0f", "tbt_p50_ms": ",.0f", "tbt_p99_ms": ",.0f",
    "e2e_p50_s": ".2f", "e2e_p99_s": ".2f",
    "limit_check": "s", "limit_metric": "s", "limit_kind": "s", "limit_fraction": ".2f", "limit_x": "s",
    "limit_text": "s", "ttft_rank": "d", "saving_vs_ref_pct": ".0f",
    "next_rps": ".4g", "next_check": "s", "next_metric": "s", "next_ratio": ".2f",
    "prompt_util_pct": ".0f", "token_util_pct": ".0f", "mixed_util_pct": ".0f",
    "peak_kv_pct": ".1f", "borrowed": ",d", "preemptions": ",d", "events": ",d",
}
RUN: dict[str, str] = {
    "workload": "s", "model": "s", "hardware": "s", "budget_machines": "d", "systems": "d", "slos": "s",
    "best_system": "s", "best_rps": ".4g", "least_system": "s", "least_rps": ".4g",
    "cheapest_system": "s", "cheapest_cost": ",.0f",
    "stats_rps": ".4g", "stats_requests": ",d", "prompt_tokens_p50": ",.0f", "prompt_tokens_mean": ",.0f",
    "output_tokens_p50": ",.0f", "output_tokens_mean": ",.0f",
    # the reference: the same machines unsplit under the default policy (compare/goodput.py REFERENCE)
    "ref_rps": ".4g", "ref_split": "s", "ref_design": "s", "ref_tbt_p99_ms": ",.0f",
    "ref_limit_check": "s", "ref_limit_kind": "s", "ref_limit_metric": "s", "ref_limit_text": "s",
    "ref_events": ",d", "ref_util_pct": ".0f",
}
# {vs.<system>}: goodput over that system's; {cost_vs.<system>}, {ttft_vs.<system>},
# {tbt_vs.<system>}: cost per output token, P50 TTFT, P50 TBT over that system's
RATIO: dict[str, str] = {"vs": ".2f", "cost_vs": ".1f", "ttft_vs": ".1f", "tbt_vs": ".1f"}

_QUANTILE = {"p50": "P50", "p90": "P90", "p99": "P99"}


def known() -> set[str]:
    """Every name a template may use (a name outside it is a typo)."""
    return (set(SYSTEM) | set(RUN) | {f"{s}.{n}" for s in SYSTEMS for n in SYSTEM}
            | {f"{r}.{s}" for r in RATIO for s in SYSTEMS})


def spec(name: str) -> str:
    """The format of a known name."""
    head, _, tail = name.partition(".")
    if not tail:
        return SYSTEM.get(name) or RUN[name]
    return RATIO[head] if head in RATIO else SYSTEM[tail]


def text(name: str, value) -> str:
    s = spec(name)
    return str(value) if s == "s" else format(value, s)


def check_words(check: str) -> str:
    """tbt_p99 -> 'P99 TBT slowdown'; goodput_attainment -> 'SLO attainment'."""
    metric, _, q = check.partition("_")
    if q in _QUANTILE:
        return f"{_QUANTILE[q]} {metric.upper()} slowdown"
    return "SLO attainment"


def _system(r: dict) -> dict:
    """One system's own figures: from its row of results["systems"]."""
    m, f = r.get("at_goodput"), r.get("finding") or {}
    out: dict[str, Any] = {}
    if r.get("goodput_rps") is None or m is None:
        return out
    counts = r["cluster"]
    out.update(goodput_rps=r["goodput_rps"], split=r["split"], rps_per_machine=r["goodput_rps"] / sum(counts))
    if len(counts) == 2:
        out.update(prompt_machines=counts[0], token_machines=counts[1])
    if f.get("baseline"):
        out["baseline"] = f["baseline"]
        if f.get("ours") is not None:
            out["vs_baseline"] = f["ours"]
    out.update({f"{x}_{q}_ms": m[f"{x}_{q}_s"] * 1e3 for x in ("ttft", "tbt") for q in ("p50", "p99")})
    out.update(e2e_p50_s=m["e2e_p50_s"], e2e_p99_s=m["e2e_p99_s"])
    if m["cost_per_m_output_tokens"] is not None:
        out["cost_per_mtok"] = m["cost_per_m_output_tokens"]
    nxt = ""
    if r.get("next_rps") is not None:
        out.update(next_rps=r["next_rps"], next_check=r["next_worst"], next_metric=check_words(r["next_worst"]),
                   next_ratio=r["next_ratio"])
        nxt = (f"; {m['attainment_target'] / r['next_ratio']:.1%} at the next rate, {r['next_rps']:.4g} req/s"
               if m["attainment"] is not None else    # the search's violation: target / attainment
               f"; at the next rate, {r['next_rps']:.4g} req/s, {check_words(r['next_worst'])} {r['next_ratio']:.2f}x")
    if m["attainment"] is not None:    # DistServe's SLOs: the share within them binds, a floor
        out.update(limit_check="attainment", limit_kind="attainment", limit_metric=check_words("attainment"),
                   limit_fraction=m["attainment_target"] / m["attainment"] if m["attainment"] else float("inf"),
                   limit_x=f"{m['attainment_target']:.0%}",
                   limit_text=f"the share of requests within the TTFT and TPOT SLOs ({m['attainment']:.1%} at "
                              f"goodput against a {m['attainment_target']:.0%} target{nxt})")
    else:
        out.update(limit_check=m["worst_check"], limit_kind=m["worst_check"].partition("_")[0],
                   limit_metric=check_words(m["worst_check"]), limit_fraction=m["worst_ratio"],
                   limit_x=f"{m['worst_limit']:g}x",
                   limit_text=f"the {check_words(m['worst_check'])} ({m['worst_ratio']:.2f} of its "
                              f"{m['worst_limit']:g}x limit at goodput{nxt})")
    out.update({f"{pool}_util_pct": u * 100 for pool, u in m["utilization"].items()})
    out.update(peak_kv_pct=m["peak_kv_fraction"] * 100, borrowed=m["borrowed"], preemptions=m["preemptions"],
               events=m["events"])
    return out


def _run(res: dict, own: dict[str, dict]) -> dict:
    sc, b = res["scenario"], res["budget"]
    out = {"workload": sc["workload"], "model": sc["model"], "hardware": b["hardware"],
           "budget_machines": b["machines"], "systems": len(own),
           "slos": "DistServe's TTFT and TPOT SLOs" if sc["goodput"] else "Splitwise's nine slowdown SLOs"}
    if own:
        best = max(own, key=lambda s: own[s]["goodput_rps"])
        least = min(own, key=lambda s: own[s]["goodput_rps"])
        out.update(best_system=best, best_rps=own[best]["goodput_rps"], least_system=least,
                   least_rps=own[least]["goodput_rps"])
        costs = {s: f["cost_per_mtok"] for s, f in own.items() if "cost_per_mtok" in f}
        if costs:
            cheap = min(costs, key=costs.__getitem__)
            out.update(cheapest_system=cheap, cheapest_cost=costs[cheap])
    st = res.get("workload_stats")
    if st:
        out.update(stats_rps=st["rps"], stats_requests=st["requests"],
                   **{k: st[k] for k in ("prompt_tokens_p50", "prompt_tokens_mean",
                                         "output_tokens_p50", "output_tokens_mean")})
    ref = _system(res["reference"]) if res.get("reference") else {}
    if ref:
        out.update(ref_rps=ref["goodput_rps"], ref_split=ref["split"], ref_design=res["reference"]["design"],
                   ref_tbt_p99_ms=ref["tbt_p99_ms"], ref_events=ref["events"], ref_util_pct=ref["mixed_util_pct"],
                   **{f"ref_{k}": ref[k] for k in ("limit_check", "limit_kind", "limit_metric", "limit_text")})
    return out


def facts(res: dict) -> dict[str, dict]:
    """system -> {name: value}: every figure its paragraph may quote, from `res` alone."""
    own = {r["system"]: _system(r) for r in res["systems"]}
    own = {s: f for s, f in own.items() if f}
    run = _run(res, own)
    ranked = sorted((f["goodput_rps"] for f in own.values()), reverse=True)
    costs = sorted(f["cost_per_mtok"] for f in own.values() if "cost_per_mtok" in f)
    ttfts = sorted(f["ttft_p50_ms"] for f in own.values())
    for mine in own.values():
        mine["rank"] = ranked.index(mine["goodput_rps"]) + 1
        mine["ttft_rank"] = ttfts.index(mine["ttft_p50_ms"]) + 1          # 1: the lowest P50 TTFT
        mine["vs_best"] = mine["goodput_rps"] / run["best_rps"]
        if "ref_rps" in run:
            mine["vs_ref"] = mine["goodput_rps"] / run["ref_rps"]
            mine["saving_vs_ref_pct"] = 100 * (1 - run["ref_rps"] / mine["goodput_rps"])
        if "cost_per_mtok" in mine:
            mine["cost_rank"] = costs.index(mine["cost_per_mtok"]) + 1
            mine["cost_vs_cheapest"] = mine["cost_per_mtok"] / run["cheapest_cost"]
    out: dict[str, dict] = {}
    for r in res["systems"]:
        mine = own.get(r["system"], {})
        f = {**run, **mine}
        for other, theirs in own.items():
            f.update({f"{other}.{k}": v for k, v in theirs.items()})
            if mine:
                f[f"vs.{other}"] = mine["goodput_rps"] / theirs["goodput_rps"]
                f[f"ttft_vs.{other}"] = mine["ttft_p50_ms"] / theirs["ttft_p50_ms"]
                f[f"tbt_vs.{other}"] = mine["tbt_p50_ms"] / theirs["tbt_p50_ms"]
                if "cost_per_mtok" in mine and "cost_per_mtok" in theirs:
                    f[f"cost_vs.{other}"] = mine["cost_per_mtok"] / theirs["cost_per_mtok"]
        out[r["system"]] = f
    return out
