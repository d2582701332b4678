"""The `splitserve bench` command. Cheap to import: everything heavy loads inside the function."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer


def bench(
    url: Annotated[str, typer.Option(help="The server, e.g. http://127.0.0.1:8000 (POST {url}/v1/completions).")],
    rps: Annotated[float, typer.Option(help="Mean arrival rate, requests/s (a trace is rescaled to it).")],
    duration: Annotated[float, typer.Option(help="Seconds of arrivals to send.")],
    out: Annotated[Path, typer.Option(help="Directory for summary.json and requests.jsonl.")],
    workload: Annotated[str, typer.Option(help="coding, conversation, or an Azure LLM trace CSV (same requests as `splitserve simulate` for the same seed).")] = "coding",
    seed: Annotated[int, typer.Option(help="Seed of the workload and of the prompt token ids.")] = 0,
    arrivals: Annotated[str, typer.Option(help="poisson, trace (a CSV's own timestamps) or auto.")] = "auto",
    model: Annotated[Optional[str], typer.Option(help="Model name to send (default: the first of GET /v1/models).")] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="Sent as 'Authorization: Bearer KEY'.")] = None,
    max_tokens_cap: Annotated[Optional[int], typer.Option("--max-tokens-cap", help="Cap each request's max_tokens (CHANGES the workload; for small models).")] = None,
    max_prompt_tokens: Annotated[Optional[int], typer.Option("--max-prompt-tokens", help="Cap each prompt's length (CHANGES the workload; for small models).")] = None,
    max_context: Annotated[Optional[int], typer.Option(help="Clip prompt+output to this many tokens, as `splitserve simulate --max-context` does.")] = None,
    token_id_min: Annotated[int, typer.Option(help="Smallest prompt token id.")] = 1,
    token_id_max: Annotated[int, typer.Option(help="Largest prompt token id (keep below the model's vocabulary size).")] = 255,
    timeout: Annotated[float, typer.Option(help="Seconds one request may take before it counts as failed.")] = 300.0,
    max_connections: Annotated[int, typer.Option(help="Concurrent HTTP connections (in-flight requests) at most.")] = 1000,
    no_ignore_eos: Annotated[bool, typer.Option("--no-ignore-eos", help="Do not send the vLLM 'ignore_eos' field.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print summary.json to stdout instead of a table.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress line.")] = False,
) -> None:
    """Replay a workload open-loop against a live OpenAI-compatible server; measure TTFT, TBT and
    E2E at the client; write summary.json with the simulator's metric names."""
    from .run import BenchOptions, run_bench
    from ..errors import UserError

    if max_context is not None and max_context < 2:
        raise UserError(f"--max-context must be at least 2 tokens, got {max_context}")
    summary = run_bench(BenchOptions(
        url=url, workload=workload, rps=rps, duration=duration, out=out, seed=seed,
        arrivals=arrivals, model=model, api_key=api_key, max_tokens_cap=max_tokens_cap,
        max_prompt_tokens=max_prompt_tokens, max_context=max_context, token_id_min=token_id_min,
        token_id_max=token_id_max, timeout=timeout, max_connections=max_connections,
        ignore_eos=not no_ignore_eos, progress=not (quiet or json_out)))
    if json_out:
        typer.echo(json.dumps(summary, indent=2))
    else:
        from .table import print_bench_summary

        typer.echo(f"wrote {Path(out) / 'summary.json'}")
        print_bench_summary(summary)
