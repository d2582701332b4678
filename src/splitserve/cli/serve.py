"""`splitserve serve`: the front end, router and workers of one phase-split cluster.

    splitserve serve --model tiny --prompt-workers 1 --token-workers 1
    splitserve serve --model /models/llama3-8b --prompt-workers 2 --token-workers 2 --device cuda
    splitserve serve --model tiny --design baseline --mixed-workers 2 --api-key secret
    splitserve serve --model llama3-8b --device cuda --prompt-tp 2 --token-tp 1
    splitserve serve --plan out/provision.json --device cuda --scale-to-fit

The options become one ServeConfig (serve/config.py); the server's modules (the `serve` extra:
fastapi, uvicorn, zmq) are imported when the command runs.
"""

from __future__ import annotations

import logging
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import UserError
from ..nodes.ray_cluster import local_ip
from ..policy.config import OPTIONS, SERVING, PolicyConfig, policy_options
from ..serve.config import RequestLimits, ServeConfig
from .lists import ListedHelp

logger = logging.getLogger(__name__)
app = typer.Typer()
PARALLEL = "Parallelism and plans"
PLAN_SETS = ("prompt_workers", "token_workers", "mixed_workers", "design", "tp", "prompt_tp", "token_tp")


@app.command(cls=ListedHelp)
@policy_options(defaults=SERVING)
def serve(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="A Hugging Face-format directory or a preset: {presets}.")] = "tiny",
    prompt_workers: Annotated[int, typer.Option("--prompt-workers", help="Workers in the prompt pool.")] = 1,
    token_workers: Annotated[int, typer.Option("--token-workers", help="Workers in the token pool.")] = 1,
    mixed_workers: Annotated[int, typer.Option("--mixed-workers", help="Workers in the mixed pool.")] = 0,
    design: Annotated[str, typer.Option(help="splitwise (phase split) or baseline (every request whole on one mixed worker).")] = "splitwise",
    tp: Annotated[int, typer.Option(help="Tensor-parallel processes of each worker, one per GPU (gloo on CPU), every pool's unless --prompt-tp/--token-tp say otherwise (the mixed pool runs at --tp). Locally, CUDA workers get tp GPUs each (CUDA_VISIBLE_DEVICES); on Ray, a worker's actor asks for tp GPUs of one node.", rich_help_panel=PARALLEL)] = 1,
    prompt_tp: Annotated[Optional[int], typer.Option(help="--tp of the prompt pool's workers (default --tp).", rich_help_panel=PARALLEL)] = None,
    token_tp: Annotated[Optional[int], typer.Option(help="--tp of the token pool's workers (default --tp).", rich_help_panel=PARALLEL)] = None,
    plan: Annotated[Optional[Path], typer.Option(help="Serve what `splitserve provision` (its provision.json) or `simulate` (its summary.json) chose: the pools' workers and tp, the model (where the engine has a preset of that name) and the policy; checked against this host's GPUs (CPU cores with --device cpu) first.", rich_help_panel=PARALLEL)] = None,
    scale_to_fit: Annotated[bool, typer.Option("--scale-to-fit", help="--plan: shrink the plan to this host (its GPUs; with --device cpu, its CPU cores), the prompt:token ratio kept as near as it can be; prints each change.", rich_help_panel=PARALLEL)] = False,
    host: Annotated[str, typer.Option(help="Address the HTTP server binds to.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port (0: any free port).")] = 8000,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="SPLITSERVE_API_KEY", help="Require 'Authorization: Bearer KEY' on /v1/* and /debug/*. Prefer the environment variable or --api-key-file: a command line is visible to every local user.")] = None,
    api_key_file: Annotated[Optional[str], typer.Option("--api-key-file", help="Read the API key from this file (its first line).")] = None,
    backend: Annotated[str, typer.Option(help="local (worker processes here) or ray (one Ray actor per worker, spread over the nodes of a local Ray instance or of the cluster at --ray-address; docs/ray.md).")] = "local",
    ray_address: Annotated[Optional[str], typer.Option("--ray-address", help="Ray cluster address, HOST:PORT of its head (default: start a local Ray instance).")] = None,
    worker_host: Annotated[Optional[str], typer.Option("--worker-host", help="Address the router's internal socket (and local workers' KV sockets) bind to; every worker must reach it (default: 127.0.0.1; with --backend ray --ray-address, this host's IP as the Ray cluster sees it, and each Ray worker binds its own node's IP).")] = None,
    device: Annotated[str, typer.Option(help="Worker device: cpu, cuda or auto.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16 or auto.")] = "auto",
    cuda_graphs: Annotated[bool, typer.Option("--cuda-graphs", help="CUDA workers replay their decode-only steps from CUDA graphs, each (batch, context) bucket captured the first time it runs (engine/cuda_graph.py); steps with a prompt run eagerly.")] = False,
    kernels: Annotated[str, typer.Option(help="The workers' layer kernels (engine/kernels.py): torch (the path measured on GPUs), triton (Triton's fused and paged-attention kernels; CUDA workers only; not yet run on a GPU), or auto (triton on CUDA when it imports, torch otherwise).")] = "torch",
    prefix_caching: Annotated[bool, typer.Option("--prefix-caching/--no-prefix-caching", help="Each worker keeps the K/V of full blocks of prompts it computed (or received) and a later prompt with the same prefix shares them, computing only the rest (policy/prefix_cache.py); least recently used first out when blocks are short.")] = True,
    transfer_timeout: Annotated[float, typer.Option(help="Seconds a KV transfer may go without progress (a step of the prompt starting, a layer arriving) before its blocks are freed and the request restarts; raise it where one prompt step takes longer.")] = 5.0,
    heartbeat_timeout: Annotated[float, typer.Option(help="Seconds of silence after which a worker is taken for hung, killed and replaced; workers report between engine steps, so it must exceed the longest step. A worker whose router is silent for twice as long exits.")] = 15.0,
    worker_start_timeout: Annotated[float, typer.Option(help="Seconds a worker may take to load its model and say hello; a replacement that does not is killed and started again.")] = 180.0,
    drain_timeout: Annotated[float, typer.Option(help="On SIGTERM/SIGINT: seconds the requests in flight may take to finish (new ones get 503); then each ends with an error (a stream: an error event and [DONE]).")] = 20.0,
    max_body_mb: Annotated[float, typer.Option(help="Largest request body, in MiB (HTTP 413 past it).")] = 8.0,
    max_stop_strings: Annotated[int, typer.Option(help="Stop strings per request at most.")] = 16,
    max_stop_chars: Annotated[int, typer.Option(help="Characters per stop string at most.")] = 256,
    kv_encryption: Annotated[str, typer.Option("--kv-encryption", help="Encrypt the router/worker and worker/worker (KV) ZeroMQ traffic with CURVE, keys derived from the cluster secret: on, off, or auto (on unless --worker-host is a loopback address and no --ray-address is given; encryption costs KV throughput).")] = "auto",
    transport: Annotated[str, typer.Option(help="KV transport: tcp (works across hosts), local (workers on this host: the prompt worker writes KV straight into the token worker's shared-memory / CUDA IPC cache) or nccl (KV by torch.distributed send/recv between each pair of workers: NCCL on CUDA, a GPU per worker; gloo with --device cpu; unencrypted: with workers off loopback it needs --kv-encryption off).")] = "tcp",
    max_queue: Annotated[int, typer.Option(help="Requests in flight at most; more get HTTP 429.")] = 256,
    num_blocks: Annotated[Optional[int], typer.Option(help="KV cache blocks per worker (default: the engine's).")] = None,
    max_num_seqs: Annotated[int, typer.Option(help="Sequences per worker batch at most.")] = 256,
    seed: Annotated[int, typer.Option(help="Seed of the workers' samplers (requests without their own seed).")] = 0,
    worker_threads: Annotated[int, typer.Option(help="Torch threads per worker.")] = 1,
    pin_workers: Annotated[bool, typer.Option("--pin-workers", help="CPU workers: run worker i on its own --worker-threads cores (those after worker i-1's, round this process's cores) instead of where the OS moves it; with more workers than cores, workers share cores in turn. Steadier step times; `splitserve twin --pin-workers` models it.")] = False,
    tokenizer_dir: Annotated[Optional[Path], typer.Option("--tokenizer-dir", help="A preset with a built-in tokenizer (tiny): write it here as a Hugging Face tokenizer directory for benchmark clients (guidellm, aiperf), and print the path (default: $XDG_CACHE_HOME/splitserve/tokenizers/MODEL, ~/.cache when unset).")] = None,
    step_log: Annotated[Optional[Path], typer.Option("--step-log", help="Directory: each worker appends a JSON line per engine step to DIR/worker-<id>.jsonl on its host (start, seconds, the worker's CPU seconds, each sequence's KV tokens before and tokens run, and the prompt tokens of each prompt whose KV the step sent), to check a performance model against (`splitserve twin` reads them).")] = None,
    chat_template: Annotated[Optional[Path], typer.Option("--chat-template", help="A Jinja2 chat template file to use in place of the model's own (tokenizer_config.json's chat_template, or chat_template.jinja), rendered as transformers does.")] = None,
    log_stats_interval: Annotated[float, typer.Option("--log-stats-interval", help="Seconds between the router's stats lines in the log, one per pool (throughput, running and waiting requests, KV usage, as vLLM's); 0: none.")] = 10.0,
    no_restart_workers: Annotated[bool, typer.Option("--no-restart-workers", help="Mark dead workers down instead of replacing them.")] = False,
    worker_mode: Annotated[str, typer.Option(hidden=True, help="BENCHMARK TOOL: 'echo' returns tokens without computing.")] = "engine",
    echo_token_delay: Annotated[float, typer.Option(hidden=True, help="Echo mode only: one token per step, each step this many seconds.")] = 0.0,
    debug_layer_delay: Annotated[float, typer.Option(hidden=True, help="Tests only: seconds of sleep after each prefill layer on prompt workers.")] = 0.0,
    debug_fail_token: Annotated[Optional[int], typer.Option(hidden=True, help="Tests only: an engine step that holds a request whose prompt has this token id raises.")] = None,
    orphan_timeout: Annotated[Optional[float], typer.Option(hidden=True, help="Tests only: seconds without word from the router (it pings every second) after which a worker exits (default: twice --heartbeat-timeout).")] = None,
    http_impl: Annotated[str, typer.Option("--http-impl", hidden=True, help="Benchmarks: uvicorn's HTTP parser (auto, h11, httptools).")] = "auto",
    loop_impl: Annotated[str, typer.Option("--loop-impl", hidden=True, help="Benchmarks: uvicorn's event loop (auto, asyncio, uvloop).")] = "auto",
    policy: PolicyConfig = PolicyConfig(),
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API with phase-split prompt/token workers."""
    if api_key_file is not None:
        try:
            api_key = open(api_key_file, encoding="utf-8").readline().strip()
        except OSError as e:
            raise UserError(f"cannot read --api-key-file {api_key_file}: {e.strerror}") from None
        if not api_key:
            raise UserError(f"--api-key-file {api_key_file} is empty")
    elif any(a == "--api-key" or a.startswith("--api-key=") for a in sys.argv):
        logger.warning("--api-key on the command line is visible in the process list; "
                       "use SPLITSERVE_API_KEY or --api-key-file")
    if max_body_mb <= 0:
        raise UserError("--max-body-mb must be > 0")
    if worker_host is None:   # the router's socket: where every worker can reach it
        worker_host = local_ip(ray_address) if backend == "ray" else "127.0.0.1"
    cfg = ServeConfig(model=model, prompt_workers=prompt_workers, token_workers=token_workers,
                      mixed_workers=mixed_workers, design=design, tp=tp, prompt_tp=prompt_tp, token_tp=token_tp, host=host, port=port, api_key=api_key,
                      backend=backend, ray_address=ray_address, worker_host=worker_host, device=device,
                      dtype=dtype, cuda_graphs=cuda_graphs, kernels=kernels, prefix_caching=prefix_caching, policy=policy, transfer_timeout_s=transfer_timeout, heartbeat_timeout_s=heartbeat_timeout,
                      transport=transport, kv_encryption=kv_encryption, max_queue=max_queue, num_blocks=num_blocks, max_num_seqs=max_num_seqs,
                      seed=seed, worker_threads=worker_threads, pin_workers=pin_workers, restart_workers=not no_restart_workers,
                      worker_mode=worker_mode, debug_layer_delay_s=debug_layer_delay, debug_fail_token=debug_fail_token,
                      orphan_timeout_s=orphan_timeout,
                      echo_token_delay_s=echo_token_delay, startup_timeout_s=worker_start_timeout,
                      drain_timeout_s=drain_timeout, log_stats_interval_s=log_stats_interval, step_log_dir=str(step_log.resolve()) if step_log else None,
                      chat_template=_read_template(chat_template),
                      limits=RequestLimits(max_body_bytes=int(max_body_mb * 2 ** 20), max_stop_strings=max_stop_strings,
                                           max_stop_chars=max_stop_chars))
    if plan is not None:
        _use_plan(ctx, cfg, plan, scale_to_fit)
    else:
        if scale_to_fit:
            raise UserError("--scale-to-fit shrinks a --plan: give --plan FILE")
        if policy.split is False and design == "splitwise":
            design = cfg.design = "baseline"   # an unsplit system: the prompt and token workers all mixed
        if policy.split and design == "baseline":
            raise UserError(f"--policy {policy.system} splits the phases: give --design splitwise")
        if design == "baseline":
            # baseline: every worker is mixed; --mixed-workers K of them, else prompt + token workers
            cfg.mixed_workers = mixed_workers or prompt_workers + token_workers
            cfg.prompt_workers = cfg.token_workers = 0
    cfg.validate()
    if step_log is not None:
        step_log.mkdir(parents=True, exist_ok=True)
    _start(cfg, tokenizer_dir, http_impl, loop_impl)


def _read_template(path: Path | None) -> str | None:
    """--chat-template's text; a UserError naming the file where it cannot be read or parsed."""
    if path is None:
        return None
    from ..serve.openai_io import read_chat_template
    return read_chat_template(path)


def _use_plan(ctx: typer.Context, cfg: ServeConfig, path: Path, scale: bool) -> None:
    """The plan in `path` onto `cfg` (serve/deploy.py); what the command line gave beside it wins."""
    def given(name: str) -> bool:     # by the source's name: typer bundles its own click
        src = ctx.get_parameter_source(name)
        return src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT")

    clash = [f"--{n.replace('_', '-')}" for n in PLAN_SETS if given(n)]
    if clash:
        raise UserError(f"--plan sets the pools, their workers and tp: leave {', '.join(clash)} out (or edit the plan)")
    _require_serve_extra()                 # the plan's checks import the engine's model config
    from ..serve.deploy import Given, apply_plan
    from ..serve.plan import read_plan

    def value(path: str):
        v = cfg.policy
        for part in path.split("."):
            v = getattr(v, part)
        return v

    apply_plan(cfg, read_plan(path), str(path), scale,
               Given(model=given("model"), max_num_seqs=given("max_num_seqs"),
                     policy={o.path: value(o.path) for o in OPTIONS if given(o.name.replace("-", "_"))},
                     system=cfg.policy.system if given("policy_system") else ""),
               log=lambda line: print(f"splitserve serve: --plan: {line}", file=sys.stderr, flush=True))


def _require_serve_extra() -> None:
    missing = next((m for m in ("fastapi", "uvicorn", "zmq", "tokenizers") if find_spec(m) is None), None)
    if missing is not None:
        raise UserError(f"serving needs the serve extra ({missing} is missing): in the splitserve checkout run "
                        "pip install torch==2.13.0 '.[serve]' (CPU PyTorch; with a GPU, install your CUDA "
                        "build of torch first and leave out the pin)")


def _start(cfg, tokenizer_dir: Path | None, http_impl: str, loop_impl: str) -> None:
    """Check what the server needs on this host (the serve extra, the model's tp, the devices and
    port, CURVE, Ray and its nodes) before any worker starts, then run it until it is stopped."""
    _require_serve_extra()
    cfg.check_host()                       # tp and devices, before any worker starts
    sock = cfg.listen()                    # the HTTP port, held from here on
    from ..engine.hf_export import client_tokenizer_note   # the engine extra: imported when serving

    note = client_tokenizer_note(cfg.model, tokenizer_dir)   # for benchmark clients (guidellm, aiperf)
    if note is not None and note.startswith("warning: "):
        logger.warning(note.removeprefix("warning: "))
    elif note is not None:
        logger.info(note)
    if cfg.kv_encrypted():
        from ..serve.curve import require_curve

        require_curve()                    # libzmq with CURVE, before any worker starts
    if cfg.backend == "ray":               # Ray started or joined, every node checked, before any worker
        from ..serve.launcher import join_ray

        join_ray(cfg, log=logger.info)
    from ..serve.server import run_server

    with sock:
        run_server(cfg, sock=sock, http=http_impl, loop=loop_impl)
