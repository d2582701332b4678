"""`splitserve reproduce splitwise --out DIR`: run the Splitwise evaluation on the simulator and
write DIR/report.md with PNG plots, every figure beside the paper's."""

from __future__ import annotations

import json
import time
from pathlib import Path

from . import experiments as ex
from . import plots


def _ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}" if theirs else "-"


def _row(cells: list) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


class Report:
    def __init__(self, out: Path):
        self.out = out
        self.lines: list[str] = []
        self._why: dict[str, list[str]] = {}

    def add(self, *lines: str) -> None:
        self.flush()
        self.lines.extend(lines)

    def table(self, header: list[str], rows: list[list]) -> None:
        self.add(_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows), "")

    def explain(self, what: str, ours: float, theirs: float, why: str) -> None:
        """Note a difference of more than 10% from the paper; one sentence per reason."""
        if theirs and abs(ours / theirs - 1) > 0.10:
            self._why.setdefault(why, []).append(f"{what} ({ours / theirs:.2f}x)")

    def flush(self) -> None:
        why, self._why = self._why, {}
        for reason, items in why.items():
            self.lines.append(f"- {', '.join(items)}: {reason}")
        if why:
            self.lines.append("")

    def write(self) -> Path:
        self.flush()
        path = self.out / "report.md"
        path.write_text("\n".join(self.lines) + "\n")
        return path


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
                         _ratio(a, pa), f"{h:.3g}", f"{ph:g}", _ratio(h, ph),
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


def heatmap(rep: Report, data: dict, pub: dict) -> None:
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
        rep.explain("machines of the cost-optimal HH cluster", ours, theirs,
                    "Our grid is coarser than the paper's, and our prompt model differs "
                    "from theirs (see the Table IV notes).")
    else:
        rep.add("No cluster in the grid met all nine SLOs.")
    rep.add("")


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
                     f"{p:g}" if p else "-", _ratio(r["rps_per_a100_hour"], p) if p else "-"])
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


def reproduce_splitwise(out: Path, quick: bool = False, profile: str | None = None,
                        workers: int | None = None, seed: int = 0, log=print) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    scale = ex.QUICK if quick else ex.FULL
    runner = ex.Runner(profile=profile, seed=seed)
    if workers:
        runner.workers = workers
    pub = ex.paper()
    t0 = time.perf_counter()
    rep = Report(out)
    rep.add("# Splitwise, reproduced on splitserve's simulator", "",
            f"Generated by `splitserve reproduce splitwise{' --quick' if quick else ''}` "
            f"(scale `{scale.name}`: {scale.duration:g} s of arrivals per simulation, seed {seed}). "
            f"Model: Llama2-70B. Performance model: "
            f"{'the profile ' + Path(profile).name if profile else 'calibrated roofline'}. "
            "The paper's figures come from Patel et al., ISCA 2024. Each ratio is ours divided by "
            "the paper's.", "")
    steps = []

    def step(name, fn):
        log(f"[{time.perf_counter() - t0:6.0f} s] {name}")
        r = fn()
        steps.append(name)
        return r

    iso = step("isolated requests (Table IV)", lambda: ex.isolated(runner))
    table4(rep, iso, pub["table4"])
    heat = step("Fig. 12 design space", lambda: ex.heatmap(runner, scale))
    heatmap(rep, heat, pub)
    clusters = {d: v for d, v in pub["iso_power"]["coding"].items()}
    sweep = step("Fig. 16 latency against load (coding)", lambda: ex.load_sweep(runner, scale, clusters, "coding"))
    load_sweep(rep, sweep, "coding", clusters)
    conv = {d: v for d, v in pub["iso_power"]["conversation"].items()}
    sweep_c = step("Fig. 16 latency against load (conversation)", lambda: ex.load_sweep(runner, scale, conv, "conversation"))
    load_sweep(rep, sweep_c, "conversation", conv)
    bj = step("batch jobs", lambda: ex.batch_job(runner, scale, clusters))
    batch_job(rep, bj, pub)
    wall = time.perf_counter() - t0
    rep.add("## Run", "", f"{runner.simulations} simulations in {wall:.0f} s on {runner.workers} worker "
            f"processes.", "")
    (out / "results.json").write_text(json.dumps(
        {"scale": scale.name, "isolated": iso, "heatmap_best": heat["best"], "load_coding": sweep,
         "load_conversation": sweep_c, "batch_job": bj, "wall_s": wall}, indent=1, default=str))
    return rep.write()
