"""EcoServe's headline claims beside ours, and the counterfactual readings that explain the gaps:
vLLM without preemption, vLLM reserving the whole context (it does not know
output lengths), both systems with the A100's whole KV instead of the paper's 12 GB, and
'sustained' read at other latency limits (the same runs). Each claim's "why" names the reading
that brings it nearest the paper, with that run's figure, or says that none does."""

from __future__ import annotations

from .ecoserve_experiments import CONTEXT, LABELS, LATENCY_FACTOR, NAMES, ORCA_BATCH
from .markdown import Report
from .versus import Claim


def _gain_readings(d: dict, other: str) -> dict[str, float]:
    """EcoServe's sustained rate over `other`'s under each counterfactual reading present in `d`."""
    g, sus = d["ecoserve_gain"], d.get("sustained_by_limit", {})
    out = {}
    if other == "vllm":
        for s, label in (("vllm-np", "over vLLM without preemption"), ("vllm-max", "over vLLM reserving the context"),
                         ("vllm-kv", "both with 0.9 of HBM for KV")):
            if s in g:
                out[label] = g[s]
    for f, rates in sus.items():
        if other in rates and rates[other]:
            out[f"'sustained' within {f}x (not {LATENCY_FACTOR:g}x)"] = rates["ecoserve"] / rates[other]
    return out


def _off(ours: float, lo: float, hi: float) -> float:
    """How far `ours` lies outside [lo, hi], as a ratio (0 inside)."""
    return max(lo / ours - 1, ours / hi - 1, 0.0)


def _why(ours: float, paper, readings: dict[str, float]) -> str:
    lo, hi = (paper, paper) if not isinstance(paper, list) else paper
    if _off(ours, lo, hi) <= 0.10:
        return "within 10% of the paper" + ("'s range" if lo != hi else "")
    if not readings:
        return "not explained: no counterfactual for this claim"
    best = min(readings, key=lambda k: _off(readings[k], lo, hi))
    got = readings[best]
    moved = f"{best}: {got:.2f} (as run {ours:.2f}; Counterfactuals)"
    if abs(got / ours - 1) < 0.02:
        return "not explained: no counterfactual brings it 2% nearer the paper (Counterfactuals)"
    if _off(got, lo, hi) <= 0.10:
        return f"explained by {moved}"
    if _off(got, lo, hi) >= _off(ours, lo, hi):
        return f"not explained: every counterfactual leaves it as far from the paper or farther (nearest: {moved})"
    if _off(got, lo, hi) <= _off(ours, lo, hi) / 2:
        return f"partly explained by {moved}; the rest not explained"
    return f"not explained: no counterfactual halves the gap; the nearest is {moved}"


def _range(v) -> str:
    return f"{v[0]:g}-{v[1]:g}x" if isinstance(v, list) else f"{v:g}x"


def mean_ssr(res: dict, system: str, *others: str) -> float | None:
    """`system`'s SSR, the mean over each dataset's rates (those `others` ran too: a cut sweep's
    overloaded rates are not run), then over the datasets."""
    ds = res["datasets"]
    if any(s not in d["points"] for d in ds for s in (system, *others)):
        return None
    k = [min(len(d["points"][s]) for s in (system, *others)) for d in ds]
    return sum(sum(p["ssr"] for p in d["points"][system][:n]) / n for d, n in zip(ds, k)) / len(ds)


def ssr_ratio(res: dict, system: str, other: str) -> float | None:
    """`system`'s mean SSR over `other`'s, on the rates both ran; None where either lacks a
    dataset's points or `other`'s is 0."""
    mine, theirs = mean_ssr(res, system, other), mean_ssr(res, other, system)
    if mine is None or not theirs:
        return None
    return mine / theirs


def claims(res: dict, pub: dict) -> list[Claim]:
    out = []
    for d in res["datasets"]:
        ds = d["dataset"]
        for other in ("vllm", "fastgen", "orca"):
            paper = pub["rate_gain"][other].get(ds)
            if paper is None or other not in d["ecoserve_gain"]:
                continue
            ours = d["ecoserve_gain"][other]
            out.append(Claim(f"{ds} rate over {other}", f"{NAMES[ds]}: EcoServe's sustained rate over {LABELS[other]} "
                             "(Fig. 10)", _range(paper), ours, "{:.2f}x", _why(ours, paper, _gain_readings(d, other))))
    ora = [d["sustained"]["oracle"]["rate"] / d["sustained"]["ecoserve"]["rate"] for d in res["datasets"]
           if "oracle" in d["sustained"]]
    if ora:
        ours = sum(ora) / len(ora)
        out.append(Claim("oracle rate", "Oracle's sustained rate over EcoServe's, mean of the datasets (§4)",
                         _range(pub["rate_gain"]["oracle"]["opt_13b"]), ours, "{:.2f}x",
                         _why(ours, pub["rate_gain"]["oracle"]["opt_13b"], {})))
    for other, key in (("vllm", "vs_vllm"), ("fastgen", "vs_fastgen"), ("orca", "vs_orca")):
        gain = ssr_ratio(res, "ecoserve", other)
        if gain is not None:
            paper = 1 + pub["ssr"][key]
            readings = {}
            if other == "vllm":
                for eco, s, label in (("ecoserve", "vllm-np", "over vLLM without preemption"),
                                      ("ecoserve", "vllm-max", "over vLLM reserving the context"),
                                      ("ecoserve-kv", "vllm-kv", "both with 0.9 of HBM for KV")):
                    r = ssr_ratio(res, eco, s)
                    if r is not None:
                        readings[label] = r
            out.append(Claim(f"ssr over {other}", f"mean SSR, EcoServe over {LABELS[other]} (Fig. 10j-l)",
                             f"{paper:.2f}x", gain, "{:.2f}x", _why(gain, paper, readings)))
    return out


def section(rep: Report, res: dict, pub: dict) -> None:
    """EcoServe's sustained-rate gain under each counterfactual reading, beside the as-run one and the paper's."""
    ds_all = res["datasets"]
    if not any(d.get("sustained_by_limit") for d in ds_all):
        return
    rep.add("## Counterfactuals: what moves the gaps", "",
            "Each row is EcoServe's sustained rate over another system's, from simulator runs on the same grid:",
            "- **vLLM without preemption**: vLLM reserving each request's true prompt + output (`--kv-allocation "
            "reserve`, the allocation of splitserve's vLLM before on demand), never recomputing.",
            "- **vLLM reserving the context**: vLLM admitting a request only with 2,048 tokens of KV free for it "
            "(Orca's iteration scheduler with max-allocation, no batch cap): what not knowing output lengths costs at "
            "worst. splitserve's `vllm` allocates blocks as sequences grow and recomputes the last-joined decode when "
            "one finds none, as the paper's vLLM allocates 32-token blocks and swaps on failure.",
            "- **both with 0.9 of HBM for KV**: EcoServe and vLLM with the A100's whole KV room instead of the "
            "paper's 12 GB (`ecoserve-kv` over `vllm-kv`).",
            f"- **'sustained' within Nx**: the same runs, the latency limit N x vLLM's lowest-rate normalized "
            f"latency instead of {LATENCY_FACTOR:g}x (the paper reads its rates off Figure 10's curves \"while "
            "maintaining similar latencies\").", "")
    rows = []
    for d in ds_all:
        ds = d["dataset"]
        row_for = {}
        for other in ("vllm", "fastgen", "orca"):
            row_for[other] = {"as run": d["ecoserve_gain"].get(other), **_gain_readings(d, other)}
        readings = list(dict.fromkeys(k for r in row_for.values() for k in r))
        rows.append([NAMES[ds], "paper"] + [_range(pub["rate_gain"][o][ds]) for o in row_for])
        for k in readings:
            rows.append([NAMES[ds], k] + [f"{row_for[o][k]:.2f}x" if row_for[o].get(k) else "-" for o in row_for])
    rep.table(["dataset", "reading", "EcoServe / vLLM", "EcoServe / FastGen", "EcoServe / ORCA"], rows)
    held = res["kv_tokens"] // CONTEXT
    if held < ORCA_BATCH and all("vllm-max" in d["points"] for d in ds_all):
        rep.add(f"With {res['kv_tokens']:,} KV tokens a {CONTEXT:,}-token reservation admits {held} requests at once, "
                f"fewer than ORCA's batch of {ORCA_BATCH}, so `vLLM reserving the context` and ORCA run alike here.", "")
