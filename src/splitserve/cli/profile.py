"""`splitserve profile`: splitserve's engine measured on this machine (twin/profiler.py), its options
one ProfileSettings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import UserError

app = typer.Typer()


@app.command()
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

    from ..twin.profiler import ProfileSettings, run_profile

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
