"""The terminal table of a live benchmark (the simulator's latency table, live fields below)."""

from __future__ import annotations

from rich.console import Console

from ..report.table import latency_table, ms_text


def print_bench_summary(s: dict, console: Console | None = None) -> None:
    console = console or Console()
    b = s["bench"]
    wl = s["workload"]
    span = f"for {wl['duration_s']:g} s" if wl["duration_s"] is not None else f"{s['requests']:,} requests"
    title = (f"live {b['url']} | {s['model'] or 'default model'} | {wl['name']} "
             f"@ {wl['rps']:g} req/s {span}")
    console.print(latency_table(s, title, (("TTFT", "ttft_s"), ("TBT", "tbt_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s"))))
    offered = f"{s['offered_rps']:.2f}" if s["offered_rps"] is not None else "-"
    console.print(
        f"requests {s['requests']:,}: {s['completed']:,} completed, {s['failed']:,} failed, "
        f"{b['rejected']:,} rejected; throughput {s['throughput_rps']:.2f} req/s "
        f"(offered {offered}); {s['tokens_generated']:,} tokens; wall {b['wall_s']:.1f} s")
    console.print(
        f"tokens/s: input {s['input_throughput']:,.1f}, output {s['output_throughput']:,.1f}, total "
        f"{s['total_token_throughput']:,.1f}; most in flight {b['peak_in_flight']:,}"
        + (f" (--max-concurrency {b['max_concurrency']:,})" if b.get("max_concurrency") else ""))
    g = s.get("goodput")
    if g:
        limits = ", ".join(f"{k} {v:g} ms" for k, v in g["slo_ms"].items())
        console.print(f"goodput ({limits}): {g['good']:,} of {s['requests']:,} requests "
                      f"({g['fraction'] * 100:.1f}%), {g['rate_rps']:.2f} req/s")
    if b.get("prompt_tokens_off"):
        console.print(f"[yellow]{b['prompt_tokens_off']} prompt(s) the server counted differently from the "
                      f"planned length (usage.prompt_tokens)[/]")
    if b["errors"]:
        console.print("[red]errors:[/] " + ", ".join(f"{k} {v}" for k, v in sorted(b["errors"].items()))
                      + (f"; first: {b['first_error']}" if b["first_error"] else ""))
    if b["rejected_by_status"]:
        console.print("rejected by status: " + ", ".join(f"{k} {v}" for k, v in sorted(b["rejected_by_status"].items())))
    if b["short_outputs"]:
        console.print(f"[yellow]{b['short_outputs']} completed request(s) got fewer tokens than "
                      f"max_tokens (the server may not support ignore_eos)[/]")
    lag = b["send_lag_s"]
    if lag["p99"] is not None and lag["p99"] > 0.01 and not b.get("max_concurrency"):
        console.print(f"[yellow]the client sent late: send lag P99 {ms_text(lag['p99'])} ms, max "
                      f"{ms_text(lag['max'])} ms (latencies count from the scheduled time)[/]")
    caps = [f"{k}={b[k]}" for k in ("max_prompt_tokens", "max_tokens_cap", "max_context") if b.get(k) is not None]
    if caps:
        console.print(f"[dim]sizes capped ({', '.join(caps)}): not the uncapped workload[/]")
