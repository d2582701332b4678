"""The `splitserve profile` and `splitserve twin` commands (typer)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import UserError
from ..policy.config import PolicyConfig, policy_options


def profile(
    out: Annotated[Path, typer.Option(help="Directory for profile.csv and machine.json (a rerun resumes).")] =
    Path("profiles/local"),
    model: Annotated[str, typer.Option(help="Engine preset or Hugging Face directory, as `serve --model`.")] = "small",
    device: Annotated[str, typer.Option(help="cpu, or cuda when there is a GPU.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16.")]
    = "auto",
    threads: Annotated[int, typer.Option(help="Torch threads, as each worker of `serve` runs (--threads).")] = 1,
    num_blocks: Annotated[Optional[int], typer.Option(help="KV blocks, as `serve --num-blocks` (default: the "
                                                           "engine's).")] = None,
    repeats: Annotated[int, typer.Option(help="Times each row is measured.")] = 3,
    hardware: Annotated[str, typer.Option(help="The machine's name in the profile (default: from the CPU/GPU).")]
    = "",
) -> None:
    """Measure splitserve's engine on this machine: prompt steps over prompt sizes, decode steps over
    batch sizes and contexts, mixed steps, the slowdown next to another busy engine, what the
    serving path adds, the KV capacity and the KV link of each transport. Writes a profile
    that `simulate --machine-profile DIR` and `twin` read (the Splitwise CSV columns, plus
    machine.json). Stop it any time: a rerun measures only what is missing."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from .profiler import ProfileSettings, run_profile

    if threads < 1 or repeats < 1:
        raise UserError("--threads and --repeats must be at least 1")
    s = ProfileSettings(model=model, device=device, dtype=dtype, threads=threads, num_blocks=num_blocks,
                        repeats=repeats, hardware=hardware)
    with Progress(TextColumn("profiling {task.fields[row]}"), BarColumn(), TextColumn("{task.completed}/{task.total} rows"),
                  TimeElapsedColumn(), TimeRemainingColumn()) as bar:
        task = bar.add_task("profile", total=None, row="")
        facts = run_profile(s, out, progress=lambda i, n, row: bar.update(task, completed=i, total=n, row=row))
    typer.echo(f"co-run slowdown next to another engine: prompt {facts['corun']['prompt']:+.1%}, decode "
               f"{facts['corun']['token']:+.1%}")
    tcp = facts["links"]["tcp"]
    typer.echo(f"{out}/profile.csv, {out}/machine.json: {facts['model']} on {facts['name']}, KV capacity "
               f"{facts['kv_capacity_tokens']:,} tokens, tcp link {tcp['fixed_s'] * 1e3:.2f} ms + "
               f"{tcp['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s")


@policy_options
def twin(
    profile_dir: Annotated[Path, typer.Option("--profile-dir", help="A `splitserve profile --out` directory: the "
                                              "machine and model to run and to simulate.")] = Path("profiles/local"),
    design: Annotated[str, typer.Option(help="splitwise (--prompt-workers + --token-workers) or baseline "
                                             "(--mixed-workers).")] = "splitwise",
    prompt_workers: Annotated[int, typer.Option("--prompt-workers", "-p", help="Prompt workers (splitwise).")] = 1,
    token_workers: Annotated[int, typer.Option("--token-workers", "-t", help="Token workers (splitwise).")] = 1,
    mixed_workers: Annotated[int, typer.Option("--mixed-workers", "-m", help="Mixed workers (baseline).")] = 2,
    workload: Annotated[str, typer.Option(help="coding, conversation, or an Azure LLM trace CSV.")] = "coding",
    rps: Annotated[Optional[float], typer.Option(help="Arrival rate, requests/s.")] = None,
    load: Annotated[Optional[float], typer.Option(help="Arrival rate as a fraction of the capacity the profile "
                                                       "predicts (instead of --rps).")] = None,
    duration: Annotated[float, typer.Option(help="Seconds of arrivals.")] = 60.0,
    seed: Annotated[int, typer.Option(help="Seed of the workload (arrivals, sizes, prompt ids).")] = 0,
    max_prompt_tokens: Annotated[Optional[int], typer.Option(help="Cap each prompt (CHANGES the workload, in both "
                                                                   "runs alike).")] = 512,
    max_tokens_cap: Annotated[Optional[int], typer.Option(help="Cap each output (CHANGES the workload, in both "
                                                                "runs alike).")] = 64,
    transport: Annotated[str, typer.Option(help="KV transport: tcp or local.")] = "tcp",
    out: Annotated[Path, typer.Option(help="Directory for report.md, cdf.png, twin.json, live/ and sim/.")] =
    Path("twin"),
    policy: PolicyConfig = PolicyConfig(),
) -> None:
    """Run the live cluster and the simulator on the same requests and compare them: starts
    `splitserve serve` on this machine, replays the workload with `splitserve bench`, simulates
    the same arrivals and sizes on the measured machine (same design and policy), and writes a
    side-by-side report (P50/P90/P99 of TTFT, TBT, E2E, throughput, ...) with the relative errors,
    the latency CDFs of both, and the live workers' engine steps against the model's time for each
    (which term of the model misses)."""
    import json

    from .machine import load_machine_profile
    from .report import compare, table_text, write_report
    from .report import samples_from_requests_jsonl as live_samples
    from .run import TwinSpec, loaded, planned, predicted_capacity, run_live, run_sim, spec_dict
    from .steps import compare_steps, read_steps, steps_markdown

    if design not in ("splitwise", "baseline"):
        raise UserError(f"--design must be splitwise or baseline, got {design!r}")
    if (rps is None) == (load is None):
        raise UserError("give one of --rps and --load")
    machine = load_machine_profile(profile_dir, transport)
    spec = TwinSpec(design=design, prompt=prompt_workers, token=token_workers, machines=mixed_workers,
                    workload=workload, rps=rps or 1.0, duration=duration, seed=seed,
                    max_prompt_tokens=max_prompt_tokens, max_tokens_cap=max_tokens_cap, transport=transport,
                    policy=policy)
    capacity = predicted_capacity(spec, machine)
    if load is not None:
        spec = dataclasses.replace(spec, rps=load * capacity)
    typer.echo(f"capacity the profile predicts: {capacity:.2f} req/s; running at {spec.rps:.2f} req/s "
               f"({spec.rps / capacity:.0%})", err=True)
    live = run_live(spec, machine, out / "live", log=lambda m: typer.echo(m, err=True))
    sim, sim_samples = run_sim(spec, machine)
    (out / "sim").mkdir(parents=True, exist_ok=True)
    (out / "sim" / "summary.json").write_text(json.dumps(sim, indent=1) + "\n")
    rows = compare(live, sim)
    step_rows = compare_steps(read_steps(out / "live" / "steps"), loaded(spec, machine, planned(spec)))
    meta = {"design": f"{design} {spec.workers()}", "model": machine.facts["model"], "machine": machine.name,
            "workload": f"{workload}, {spec.rps:.3g} req/s ({spec.rps / capacity:.0%} of the predicted "
                        f"{capacity:.3g}), {duration:g} s, seed {seed}, prompts <= {max_prompt_tokens}, "
                        f"outputs <= {max_tokens_cap}",
            "profile": str(profile_dir), "transport": transport}
    report = write_report(out, rows, title=f"Twin: {design} {spec.workers()} on {machine.name}", meta=meta,
                          live_samples=live_samples(out / "live" / "requests.jsonl"), sim_samples=sim_samples,
                          steps=steps_markdown(step_rows) if step_rows else "")
    (out / "twin.json").write_text(json.dumps({"spec": spec_dict(spec), "capacity_rps": capacity, "meta": meta,
                                               "rows": [dataclasses.asdict(r) for r in rows],
                                               "live_server": live.get("server", {}),
                                               "steps": [dataclasses.asdict(r) for r in step_rows]}, indent=1) + "\n")
    typer.echo(table_text(rows))
    if step_rows:
        typer.echo(f"engine steps: live {step_rows[-1].live_s:.1f} s, model {step_rows[-1].model_s:.1f} s "
                   f"({step_rows[-1].error:+.1%}); by kind in the report")
    typer.echo(f"wrote {report}")
