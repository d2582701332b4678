"""Readable terminal tables of a summary (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def ms_text(x) -> str:
    """Seconds `x` as milliseconds, one decimal; "-" for None."""
    return "-" if x is None else f"{x * 1000:,.1f}"


def latency_table(s: dict, title: str, rows) -> Table:
    """P50/P90/P99/mean in ms of the summary's latency entries `rows`: (label, key) pairs."""
    lat = Table(title=title, title_justify="left")
    lat.add_column("latency (ms)")
    for col in ("P50", "P90", "P99", "mean"):
        lat.add_column(col, justify="right")
    for name, key in rows:
        d = s[key]
        lat.add_row(name, ms_text(d["p50"]), ms_text(d["p90"]), ms_text(d["p99"]), ms_text(d["mean"]))
    return lat


def print_summary(s: dict, console: Console | None = None) -> None:
    console = console or Console()
    title = (f"{s['cluster_label']} | {s['model']} | {s['workload']['name']} "
             f"@ {s['workload']['rps']:g} req/s")
    console.print(latency_table(s, title, (("TTFT", "ttft_s"), ("TBT", "tbt_s"), ("E2E", "e2e_s"),
                                           ("queueing", "queue_s"))))

    slo = Table(title="SLO: slowdown vs uncontended DGX-A100 (limit)", title_justify="left")
    slo.add_column("metric")
    for col in ("P50", "P90", "P99"):
        slo.add_column(col, justify="right")
    checks = s["slo"]["checks"]
    for metric in ("ttft", "tbt", "e2e"):
        cells = []
        for p in ("p50", "p90", "p99"):
            c = checks[f"{metric}_{p}"]
            mark = "[green]ok[/]" if c["met"] else "[red]MISS[/]"
            cells.append(f"{c['slowdown']:.2f}x ({c['limit']:g}x) {mark}")
        slo.add_row(metric.upper(), *cells)
    console.print(slo)

    c = s["cluster"]
    verdict = "[green]met[/]" if s["slo"]["met"] else "[red]missed[/]"
    console.print(
        f"requests {s['completed']:,}/{s['requests']:,} completed, throughput "
        f"{s['throughput_rps']:.2f} req/s, SLO {verdict}; cluster {c['machine_count']} instances "
        f"({c.get('gpus', '?')} GPUs), "
        f"${c['cost_per_hour']:,.2f}/h, {c['power_kw']:,.1f} kW provisioned, "
        f"{c['energy_kwh']:,.2f} kWh used")
    g = s.get("goodput")
    if g and g["attainment"] is not None:
        ok = "[green]meets[/]" if g["meets_target"] else "[red]misses[/]"
        console.print(f"goodput SLOs (TTFT <= {g['ttft_slo_s']:g} s, TPOT <= {g['tpot_slo_s']:g} s): "
                      f"{g['attainment']:.1%} of requests attain both, {ok} the {g['target']:.0%} target")
    pc = s.get("prefix_cache")
    if pc:
        skipped = (s.get("kv_transfer") or {}).get("skipped_tokens")
        console.print(f"prefix cache: {pc['hit_rate']:.1%} hit rate, {pc['hits']:,} of {pc['queries']:,} prompt tokens "
                      f"cached" + (f"; {skipped:,} not sent to token machines holding them" if skipped else ""))
    if "sim" in s:
        sim = s["sim"]
        console.print(f"[dim]simulated {sim['simulated_s']:,.0f} s in {sim['wall_s']:.2f} s wall, "
                      f"{sim['events']:,} events ({sim['events_per_s'] or 0:,.0f}/s); perf model: "
                      + ", ".join(f"{k}={v}" for k, v in sim["perf_model"].items()) + "[/]")
