"""`splitserve bench`: a workload replayed open-loop against a live OpenAI-compatible server, its
options one BenchOptions (bench/run.py). The client (the `serve` extra's httpx) loads when the
command runs."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from ..errors import UserError
from .lists import ListedHelp

app = typer.Typer()


@app.command(cls=ListedHelp)
def bench(
    url: Annotated[str, typer.Option(help="The server, e.g. http://127.0.0.1:8000 (POST {url}/v1/completions or /v1/chat/completions).")],
    rps: Annotated[float, typer.Option("--rps", "--request-rate", help="Mean arrival rate, requests/s (a trace is rescaled to it).")],
    out: Annotated[Path, typer.Option(help="Directory for summary.json and requests.jsonl.")],
    duration: Annotated[Optional[float], typer.Option(help="Seconds of arrivals to send (default: none, then --num-prompts is required).")] = None,
    num_prompts: Annotated[Optional[int], typer.Option(help="Send this many requests (default: all that arrive within --duration).")] = None,
    endpoint: Annotated[str, typer.Option(help="completions (POST /v1/completions) or chat (POST /v1/chat/completions, the prompt as one user message); both streamed.")] = "completions",
    prompt_format: Annotated[Optional[str], typer.Option(help="ids (seeded token ids) or text (of the same token count, counted by the server's POST /tokenize); default ids for completions, text for chat.")] = None,
    dataset: Annotated[str, typer.Option("--dataset", "--dataset-name", help="workload (--workload), random (--random-input-len/-output-len/-range-ratio) or sharegpt (--dataset-path).")] = "workload",
    dataset_path: Annotated[Optional[str], typer.Option(help="A ShareGPT JSON file (list of {conversations: [{from: human, value}, {from: gpt, value}]}); default none.")] = None,
    random_input_len: Annotated[int, typer.Option(help="--dataset random: prompt tokens per request.")] = 1024,
    random_output_len: Annotated[int, typer.Option(help="--dataset random: output tokens per request.")] = 128,
    random_range_ratio: Annotated[float, typer.Option(help="--dataset random: lengths uniform in L (1 - r) .. L (1 + r), 0 <= r < 1.")] = 0.0,
    burstiness: Annotated[float, typer.Option(help="Gamma inter-arrivals of this shape at --rps (1: Poisson; below 1 burstier). A workload keeps its sizes in order at these arrivals (a trace's own timestamps are then not used; --arrivals trace refuses it).")] = 1.0,
    max_concurrency: Annotated[Optional[int], typer.Option(help="At most this many requests in flight; later ones wait in the client (default: no limit).")] = None,
    goodput: Annotated[Optional[List[str]], typer.Option(help="SLO limits KEY:MS, KEY one of ttft, tpot, tbt, e2el (e2e): count, fraction and rate of requests meeting all (e.g. --goodput ttft:500 --goodput tpot:50, or 'ttft:500 tpot:50'); default none.")] = None,
    percentiles: Annotated[str, typer.Option("--percentiles", "--metric-percentiles", help="Percentiles of the ms aliases in summary.json (p50_ttft_ms ...), comma-separated.")] = "50,90,99",
    max_failure_ratio: Annotated[float, typer.Option(help="Exit 1 when more than this fraction of the requests failed or were rejected.")] = 0.5,
    no_server_check: Annotated[bool, typer.Option("--no-server-check", help="Send even an unknown --model, or requests longer than the server's context (max_model_len).")] = False,
    clip_to_context: Annotated[bool, typer.Option("--clip-to-context", help="Clip prompt+output to the server's context (max_model_len), as --max-context does.")] = False,
    save_outputs: Annotated[bool, typer.Option("--save-outputs", help="Write each request's prompt, output token ids and text to requests.jsonl.")] = False,
    workload: Annotated[str, typer.Option(help="{workloads}, or an Azure LLM trace CSV (same requests as `splitserve simulate` for the same seed).")] = "coding",
    conversation: Annotated[Optional[str], typer.Option(help="--workload multiturn / sysprompt: the conversations' shape, "
                                                             "e.g. turns=10,system=0,user=64:256,reply=64:256,think=2 (token "
                                                             "ranges, mean think seconds; workload/conversations.py). Each turn "
                                                             "is sent closed-loop, think seconds after the reply before it, "
                                                             "carrying that reply's token ids (completions, --prompt-format ids); "
                                                             "--duration bounds the conversations' starts.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the workload and of the prompt token ids.")] = 0,
    arrivals: Annotated[str, typer.Option(help="poisson, trace (a CSV's own timestamps) or auto.")] = "auto",
    model: Annotated[Optional[str], typer.Option(help="Model name to send (default: the first of GET /v1/models).")] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="Sent as 'Authorization: Bearer KEY'.")] = None,
    max_tokens_cap: Annotated[Optional[int], typer.Option("--max-tokens-cap", help="Cap each request's max_tokens (CHANGES the workload; for small models; default none).")] = None,
    max_prompt_tokens: Annotated[Optional[int], typer.Option("--max-prompt-tokens", help="Cap each prompt's length (CHANGES the workload; for small models; default none).")] = None,
    max_context: Annotated[Optional[int], typer.Option(help="Clip prompt+output to this many tokens, as `splitserve simulate --max-context` does (default none).")] = None,
    token_id_min: Annotated[int, typer.Option(help="Smallest prompt token id.")] = 1,
    token_id_max: Annotated[int, typer.Option(help="Largest prompt token id (keep below the model's vocabulary size).")] = 255,
    timeout: Annotated[float, typer.Option(help="Seconds one request may take before it counts as failed.")] = 300.0,
    max_connections: Annotated[int, typer.Option(help="Concurrent HTTP connections (in-flight requests) at most.")] = 1000,
    no_ignore_eos: Annotated[bool, typer.Option("--no-ignore-eos", help="Do not send the vLLM 'ignore_eos' field.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print summary.json to stdout instead of a table.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress line.")] = False,
) -> None:
    """Replay a workload open-loop against a live OpenAI-compatible server; measure TTFT, TBT, TPOT
    and E2E at the client; write summary.json with the simulator's metric names (and vLLM's)."""
    from ..bench.run import BenchOptions, failure_message, run_bench

    if max_context is not None and max_context < 2:
        raise UserError(f"--max-context must be at least 2 tokens, got {max_context}")
    if not (math.isfinite(max_failure_ratio) and 0 <= max_failure_ratio <= 1):
        raise UserError(f"--max-failure-ratio must be between 0 and 1, got {max_failure_ratio:g}")
    summary = run_bench(BenchOptions(
        url=url, workload=workload, rps=rps, duration=duration, out=out, seed=seed,
        arrivals=arrivals, model=model, api_key=api_key, max_tokens_cap=max_tokens_cap,
        max_prompt_tokens=max_prompt_tokens, max_context=max_context, token_id_min=token_id_min,
        token_id_max=token_id_max, timeout=timeout, max_connections=max_connections,
        ignore_eos=not no_ignore_eos, progress=not (quiet or json_out), endpoint=endpoint,
        prompt_format=prompt_format, dataset=dataset, dataset_path=dataset_path,
        random_input_len=random_input_len, random_output_len=random_output_len,
        random_range_ratio=random_range_ratio, num_prompts=num_prompts, burstiness=burstiness,
        max_concurrency=max_concurrency, goodput=goodput, percentiles=percentiles,
        server_check=not no_server_check, clip_to_context=clip_to_context, save_outputs=save_outputs,
        conversation=conversation))
    if json_out:
        typer.echo(json.dumps(summary, indent=2))
    else:
        from ..bench.table import print_bench_summary

        typer.echo(f"wrote {Path(out) / 'summary.json'}")
        print_bench_summary(summary)
    failure = failure_message(summary, max_failure_ratio)
    if failure:
        print(f"error: {failure}", file=sys.stderr)
        raise typer.Exit(1)
