"""summary.md (and results.json) of a scripts/gpu_check.sh folder: each part's status and its
figures against the issue's targets, the machine named. Run after every part, so whatever stops
the check leaves a summary of what ran.

    python scripts/gpu_check_summary.py DIR
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

PARTS = [  # (name in parts.tsv, title)
    ("machine", "1. machine facts"),
    ("decode", "2a. engine decode (CUDA graphs)"),
    ("prefill", "2b. engine prefill"),
    ("kernels", "2c. profiler tables, B=1 decode step (graph and eager)"),
    ("batches", "2d. decode at serving batches, Triton kernels and torch's"),
    ("tests", "3. CUDA tests"),
    ("serve", "4. serve TPOT against the engine step"),
    ("kv_alloc", "4b. KV reserved against on demand, requests all at once"),
    ("throughput", "4c. offline throughput, ShareGPT-like requests, Triton kernels and torch's"),
    ("kv_local", "5a. KV exposed time, --transport local"),
    ("kv_nccl", "5b. KV exposed time, --transport nccl"),
    ("profile", "6a. splitserve profile"),
    ("twin", "6b. splitserve twin (P50 error)"),
]


def load(p: Path):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def statuses(d: Path) -> dict[str, dict]:
    out = {}
    try:
        lines = (d / "parts.tsv").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        f = line.split("\t")
        if len(f) >= 4:
            out[f[0]] = {"status": f[1], "seconds": f[2], "note": f[3]}
    return out


def _f(x, fmt="{:.3g}") -> str:
    return "n/a" if x is None else fmt.format(x)


def fig_machine(d: Path) -> list[str]:
    m = load(d / "machine.json") or {}
    return [f"{k}: {m[k]}" for k in ("gpu", "gpu_count", "driver", "gpu_memory", "torch", "torch_cuda", "python",
                                     "cpu", "cores", "splitserve_commit") if k in m]


def fig_decode(d: Path) -> list[str]:
    r = load(d / "decode.json")
    if not r:
        return []
    out = [f"{r['model']} {r['dtype']}, context {r['context']}, cuda_graphs {r['cuda_graphs']}, "
           f"datasheet bandwidth {_f(r.get('bandwidth_datasheet_Bps'), '{:.3g} B/s')}, measured {_f(r['bandwidth_measured_Bps'])} B/s"]
    for row in r["results"]:
        sheet = row.get("ratio_to_datasheet_bound")
        verdict = ""
        if row["batch"] == 1 and sheet is not None:
            verdict = f" -> target <= 1.3x datasheet bound: {'MET' if sheet <= 1.3 else 'MISSED'}"
        out.append(f"B={row['batch']}: {row['median_ms']:.3f} ms/step, {row['tokens_per_s']:.0f} tok/s, "
                   f"bound {_f(row.get('bound_ms_datasheet_bw'), '{:.3f}')} ms (datasheet) / "
                   f"{row['bound_ms_measured_bw']:.3f} ms (measured); ratio {_f(sheet, '{:.2f}x')} datasheet, "
                   f"{row['ratio_to_measured_bound']:.2f}x measured{verdict}")
    return out


B1_TARGET, BATCH_TARGETS = 1.35, {(64, 1024): 1.5}  # issue 46: x the datasheet bound of weights + KV read


def _batch_row(row: dict) -> str:
    if "error" in row:
        return f"{row['kernels']}: not run ({row['error'][:160]})"
    ratio = row.get("ratio_to_datasheet_bound")
    bound = row.get("bound_ms_datasheet", row["bound_ms_measured"])
    which = "datasheet" if ratio is not None else "measured bw"
    ratio = ratio if ratio is not None else row["ratio_to_measured_bound"]
    return f"{row['kernels']} {row['median_ms']:.3f} ms/step ({row['tokens_per_s']:.0f} tok/s) = {ratio:.2f}x the {bound:.3f} ms bound ({which})"


def fig_batches(d: Path) -> list[str]:
    r = load(d / "batches.json")
    if not r:
        return []
    out = [f"{r['model']} {r['dtype']}, cuda_graphs {r['cuda_graphs']}, bound = (weights {r['weight_bytes_per_step'] / 1e9:.3g} GB "
           f"+ KV read) / bandwidth (datasheet {_f(r.get('bandwidth_datasheet_Bps'), '{:.3g} B/s')}, measured "
           f"{_f(r['bandwidth_measured_Bps'], '{:.3g} B/s')})"]
    shapes: dict[tuple[int, int], list[dict]] = {}
    for row in r["results"]:
        shapes.setdefault((row["batch"], row["context"]), []).append(row)
    for (b, c), rows in shapes.items():
        line = f"B={b} ctx={c}: " + "; ".join(_batch_row(x) for x in rows)
        timed = {x["kernels"]: x for x in rows if "error" not in x}
        if "triton" in timed and "torch" in timed:
            line += f"; triton / torch x{timed['triton']['median_ms'] / timed['torch']['median_ms']:.2f}"
        target = B1_TARGET if b == 1 else BATCH_TARGETS.get((b, c))
        best = timed.get("triton", {}).get("ratio_to_datasheet_bound")
        if target is not None and best is not None:
            line += f" -> target <= {target}x datasheet bound (triton): {'MET' if best <= target else 'MISSED'}"
        out.append(line)
    return out


def fig_throughput(d: Path) -> list[str]:
    r = load(d / "throughput.json")
    if not r:
        return []
    out = [f"{r['model']} {r['dtype']}, {r['requests']} requests (mean {r['mean_prompt']:.0f} prompt, "
           f"{r['mean_output']:.0f} output tokens), at most {r['max_num_seqs']} running, KV on demand:"]
    timed = {}
    for x in r["runs"]:
        if "error" in x:
            out.append(f"{x['kernels']}: not run ({x['error'][:160]})")
            continue
        timed[x["kernels"]] = x
        out.append(f"{x['kernels']}: {x['output_tok_s']:.0f} output tokens/s, {x['total_tok_s']:.0f} tokens/s with the "
                   f"prompts, {x['wall_s']:.1f} s, running {x['running_mean']:.1f} (most {x['running_max']}), "
                   f"{x['preemptions']} preemptions")
    if "triton" in timed and "torch" in timed:
        out.append(f"triton / torch: x{timed['triton']['output_tok_s'] / timed['torch']['output_tok_s']:.2f} output tokens/s")
    return out


def fig_prefill(d: Path) -> list[str]:
    r = load(d / "prefill.json")
    if not r:
        return []
    frac = r.get("fraction_of_peak")
    verdict = "" if frac is None else f" -> target >= 50% of peak: {'MET' if frac >= 0.5 else 'MISSED'}"
    return [f"{r['model']} {r['dtype']}, {r['tokens']} tokens: {r['median_ms']:.2f} ms, {r['tokens_per_s']:.0f} tok/s, "
            f"{r['achieved_flops_per_s'] / 1e12:.2f} TFLOP/s = {_f(frac and 100 * frac, '{:.1f}%')} of datasheet peak, "
            f"{100 * r['fraction_of_measured_matmul']:.1f}% of the measured matmul{verdict}"]


def fig_kernels(d: Path) -> list[str]:
    r = load(d / "kernels.json")
    if not r:
        return []
    out = []
    for k in ("graph", "eager"):
        v = r.get(k)
        if v is None:
            out.append(f"{k}: skipped (not a CUDA device)")
        else:
            busy = v["device_kernel_ms_per_step"]
            note = " (CUPTI may not have traced the kernels inside the graph: read the eager table)" \
                if k == "graph" and busy is not None and busy < 0.05 * v["wall_ms_per_step"] else ""
            busy = f" (GPU busy {100 * busy / v['wall_ms_per_step']:.0f}% of the step){note}" if busy else note
            out.append(f"{k}: wall {v['wall_ms_per_step']:.3f} ms/step, device kernels "
                       f"{_f(v['device_kernel_ms_per_step'], '{:.3f}')} ms/step{busy}, host self "
                       f"{v['host_self_ms_per_step']:.3f} ms/step")
    out.append("tables: kernels.txt")
    return out


def fig_tests(d: Path) -> list[str]:
    try:
        text = (d / "tests.log").read_text(errors="replace")
    except OSError:
        return []
    m = re.findall(r"^(?:=+ )?(\d+ (?:passed|failed|skipped|deselected|errors?|xfailed|xpassed)\b.*? in [0-9.]+s)",
                   text, re.M)
    out = list(m)  # one line per pytest run
    if m and not any("passed" in x or "failed" in x for x in m):
        out.append("none ran: no CUDA device here" if any("skipped" in x for x in m) else "none ran")
    return out


def fig_serve(d: Path) -> list[str]:
    r = load(d / "serve_tpot.json")
    if not r:
        return []
    s, e = r["serve"], r["engine"]
    ratio = r.get("ratio_tpot_to_step")
    return [f"{r['settings']['model']} on {r['settings']['device']}, cuda_graphs {r['settings']['cuda_graphs']}, "
            f"{r['settings']['streams']} streams: serve TPOT P50 {_f(s['tpot_p50_ms'], '{:.2f}')} ms "
            f"(token worker's step P50 {_f(s['worker_step_p50_ms'], '{:.2f}')} ms), engine step P50 "
            f"{e['step_p50_ms']:.2f} ms -> ratio {_f(ratio, '{:.3f}')} (target <= {r['target']}: "
            f"{'MET' if r['meets_target'] else 'MISSED'})"]


def fig_alloc(d: Path) -> list[str]:
    r = load(d / "kv_alloc.json")
    if not r:
        return []
    out = [f"{r['model']} on {r['device']}, {r['requests']} requests (mean {r['mean_prompt']:.0f} prompt, "
           f"{r['mean_output']:.0f} output tokens):"]
    for a in ("reserve", "on-demand"):
        if a in r:
            x = r[a]
            out.append(f"{a}: {x['output_tok_s']:.0f} output tokens/s, running {x['running_mean']:.1f} "
                       f"(most {x['running_max']}), {x['preemptions']} preemptions, {x['kv_blocks']} KV blocks")
    if "on_demand_over_reserve_tok_s" in r:
        out.append(f"on demand / reserve: x{r['on_demand_over_reserve_tok_s']:.2f} tokens/s")
    return out


def fig_kv(d: Path, name: str) -> list[str]:
    r = load(d / f"{name}.json")
    if not r:
        return []
    out = []
    for run in r.get("runs", []):
        if "error" in run:
            out.append(f"{run.get('transport')} {run.get('mode')}: ERROR {str(run['error']).splitlines()[0][:200]}")
            continue
        s = run["summary"]
        out.append(f"{run['transport']} {run['mode']}: exposed P50 {s['exposed_ms_p50']:.3f} ms "
                   f"(min {s['exposed_ms_min']:.3f}, max {s['exposed_ms_max']:.3f}), transfer P50 "
                   f"{1e3 * s['transfer_s_p50']:.1f} ms, {s['gb_per_s_p50']:.2f} GB/s, {s['bytes_per_transfer']:.3g} B"
                   + (f" -> target < 1 ms: {'MET' if s['exposed_ms_p50'] < 1 else 'MISSED'}"
                      if run["mode"] == "layerwise" else ""))
    return out


def fig_profile(d: Path) -> list[str]:
    m = load(d / "profile" / "machine.json")
    if not m:
        return []
    try:
        rows = len((d / "profile" / "profile.csv").read_text().splitlines()) - 1
    except OSError:
        rows = 0
    out = [f"{m.get('model')} {m.get('dtype')} on {m.get('device')} ({m.get('name', '?')}): profile.csv rows {rows}, "
           f"KV capacity {m.get('kv_capacity_tokens')} tokens"]
    for name, link in (m.get("links") or {}).items():
        if isinstance(link, dict) and "bandwidth_bytes_per_s" in link:
            out.append(f"{name} link: {1e3 * link.get('fixed_s', 0):.3f} ms + {link['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s")
    c = m.get("corun") or {}
    if "prompt" in c:
        out.append(f"co-run slowdown next to another engine: prompt {100 * c['prompt']:+.1f}%, decode {100 * c['token']:+.1f}%")
    return out


def fig_twin(d: Path) -> list[str]:
    r = load(d / "twin" / "twin.json")
    if not r:
        return []
    out = [f"{r['meta'].get('design')} {r['meta'].get('model')} on {r['meta'].get('machine')}: {r['meta'].get('workload')}"]
    for row in r["rows"]:
        if "P50" in row["metric"] and row.get("rel_error") is not None:
            err = row["rel_error"]
            out.append(f"{row['metric']}: live {row['live']:.4g}, simulated {row['sim']:.4g}, error {100 * err:+.1f}% "
                       f"(target within 10%: {'MET' if abs(err) <= 0.10 else 'MISSED'})")
    return out


FIGS = {"machine": fig_machine, "decode": fig_decode, "prefill": fig_prefill, "kernels": fig_kernels,
        "batches": fig_batches, "throughput": fig_throughput,
        "tests": fig_tests, "serve": fig_serve, "kv_alloc": fig_alloc, "kv_local": lambda d: fig_kv(d, "kv_local"),
        "kv_nccl": lambda d: fig_kv(d, "kv_nccl"), "profile": fig_profile, "twin": fig_twin}


def main(argv: list[str] | None = None) -> int:
    d = Path((argv or sys.argv[1:])[0])
    st = statuses(d)
    m = load(d / "machine.json") or {}
    lines = [f"# GPU check: {m.get('gpu', 'no GPU')} ({m.get('device', '?')})", "",
             f"Machine: {m.get('gpu', 'no GPU')}, driver {m.get('driver', 'n/a')}, torch {m.get('torch', '?')} "
             f"(CUDA {m.get('torch_cuda', 'n/a')}), Python {m.get('python', '?')}, {m.get('cpu', '?')} x{m.get('cores', '?')}; "
             f"commit {m.get('splitserve_commit', '?')}; started {m.get('started', '?')}; command `{m.get('command', '?')}`",
             "", "Targets (issue 26): decode B=1 <= 1.3x datasheet bound; prefill >= 50% of datasheet peak; "
             "serve TPOT <= 1.15x engine step; CUDA IPC exposed < 1 ms per layer-wise transfer; twin P50 within 10%. "
             "Issue 46: decode B=1 <= 1.35x, B=64 at 1,024 tokens <= 1.5x the bound of weights + KV read; "
             "prefill 2048 >= 60%; serve TPOT <= 1.1x the engine step.", ""]
    results = {"machine": m, "parts": {}}
    for name, title in PARTS:
        s = st.get(name, {"status": "not run", "seconds": "", "note": "the check stopped before this part"})
        try:
            figs = FIGS[name](d) if s["status"] not in ("skipped", "not run") else []
        except Exception as e:  # a malformed result file is a finding, not a crash of the summary
            figs = [f"summary could not read this part's figures: {e!r}"]
        lines.append(f"## {title}")
        head = f"status: {s['status']}" + (f" ({s['seconds']} s)" if s["seconds"] else "")
        lines.append(head + (f"; {s['note']}" if s["note"] else ""))
        lines += [f"- {x}" for x in figs] or (["- no figure (see the part's log)"] if s["status"] not in
                                               ("skipped", "not run") else [])
        lines.append("")
        results["parts"][name] = {**s, "figures": figs}
    (d / "summary.md").write_text("\n".join(lines))
    (d / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
