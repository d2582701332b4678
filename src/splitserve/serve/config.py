"""Settings of one `splitserve serve` cluster (front end, router and workers)."""

from __future__ import annotations

import dataclasses
import errno
import socket
from dataclasses import dataclass, field

from ..engine.kernels import KERNEL_CHOICES
from ..errors import UserError
from ..policy.config import PolicyConfig


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may ask of the front end (schema.py, api.py); docs/reliability.md."""

    max_body_bytes: int = 8 << 20     # HTTP 413 past this (before the body is read, if announced)
    max_stop_strings: int = 16        # OpenAI allows 4; vLLM has no limit
    max_stop_chars: int = 256         # per stop string
    max_token_list: int = 1024        # entries of stop_token_ids and of logit_bias
    max_schema_bytes: int = 16 << 10  # response_format's JSON schema (as JSON), and the grammar made of it


@dataclass(slots=True)
class ServeConfig:
    model: str = "tiny"
    prompt_workers: int = 1
    token_workers: int = 1
    mixed_workers: int = 0
    design: str = "splitwise"            # splitwise | baseline
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    backend: str = "local"               # local | ray
    ray_address: str | None = None
    worker_host: str = "127.0.0.1"       # where the router's and workers' internal sockets bind
    worker_mode: str = "engine"          # engine | echo (benchmark tool: no computation)
    transport: str = "tcp"               # tcp | local (workers on this host; see serve/kv/)
    kv_encryption: str = "auto"          # auto | on | off: CURVE on the internal sockets (serve/curve.py)
    transfer_timeout_s: float = 5.0
    max_queue: int = 256                 # requests in flight (admitted, not finished) at most
    retry_after_s: int = 1
    device: str = "cpu"
    dtype: str = "auto"
    prefix_caching: bool = True          # workers share cached K/V of prompts' common prefixes (policy/prefix_cache.py)
    cuda_graphs: bool = False            # decode-only steps of CUDA workers replay CUDA graphs (engine/cuda_graph.py)
    kernels: str = "torch"               # the workers' kernels: torch | triton | auto (engine/kernels.py)
    tp: int = 1                          # tensor-parallel processes (GPUs) per worker: every pool's default
    prompt_tp: int | None = None         # the prompt pool's (default: tp); the mixed pool runs at tp
    token_tp: int | None = None          # the token pool's (default: tp)
    gpu_ids: tuple[str, ...] = ()        # this host's GPUs the local workers share out (gpus.py); (): none
    seed: int = 0
    num_blocks: int | None = None        # KV blocks per worker (default: the engine's)
    max_num_seqs: int = 256
    policy: PolicyConfig = PolicyConfig()  # the scheduling policies: the router's and every worker's
    worker_threads: int = 1
    pin_workers: bool = False            # CPU workers: worker i runs on its own cores (worker_cpus), not where the OS moves it
    restart_workers: bool = True         # replace a worker that died (with back-off, never giving up)
    max_attempts: int = 3                # tries of one request across worker deaths
    # liveness, from one setting: the router takes a worker silent this long for hung; a worker
    # takes a router silent for twice as long for gone, and exits (orphan_timeout_s overrides
    # that for tests only)
    heartbeat_timeout_s: float = 15.0
    orphan_timeout_s: float | None = None
    startup_timeout_s: float = 180.0     # a worker that has not said hello by then is replaced
    park_timeout_s: float = 30.0         # how long a request may wait for a live worker
    drain_timeout_s: float = 20.0        # on SIGTERM: how long requests in flight may finish
    limits: RequestLimits = field(default_factory=RequestLimits)
    step_log_dir: str | None = None      # each worker appends its engine steps to DIR/worker-<id>.jsonl
    chat_template: str | None = None     # --chat-template: a Jinja2 chat template in place of the model's
    log_stats_interval_s: float = 10.0   # the router logs each pool's stats this often (0: never; stats_log.py)
    debug_layer_delay_s: float = 0.0     # tests only: slow each prefill layer down
    debug_fail_token: int | None = None  # tests only: a step holding a prompt with this token raises
    echo_token_delay_s: float = 0.0      # echo mode only: one token per step, steps this long

    def model_config(self):
        """The served model's ModelConfig (a preset or a checkpoint's config.json)."""
        from pathlib import Path

        from ..engine.config import ModelConfig
        from ..engine.presets import get_preset

        p = Path(self.model)
        return ModelConfig.from_dir(p) if p.is_dir() else get_preset(self.model)

    def max_model_len(self) -> int:
        """The served model's context, from its config."""
        return self.model_config().max_position_embeddings

    def pool_tp(self, home: str) -> int:
        """The tensor parallel of a worker of pool `home` (prompt, token, mixed)."""
        own = {"prompt": self.prompt_tp, "token": self.token_tp}.get(home)
        return self.tp if own is None else own

    def worker_tps(self) -> list[int]:
        """Each worker's tensor parallel, by worker id."""
        return [self.pool_tp(h) for h in self.homes()]

    def check_tp(self) -> None:
        """Every pool's tp is one the model's heads can take (engine/sharding.py; one error line)."""
        pools = {h: self.pool_tp(h) for h in self.homes() if self.pool_tp(h) > 1}
        if self.worker_mode != "engine" or not pools:
            return                      # echo workers ignore tp
        from ..engine.sharding import check_tp

        cfg = self.model_config()
        for home, tp in pools.items():
            try:
                check_tp(cfg, tp)
            except UserError as e:
                raise UserError(f"--model {self.model}, {home} pool: {e}") from None

    def worker_policy(self) -> PolicyConfig:
        """The policy as each worker runs it: its engine admits at most max_num_seqs requests."""
        return dataclasses.replace(self.policy, batching=dataclasses.replace(self.policy.batching,
                                                                             max_seqs=self.max_num_seqs))

    def kv_encrypted(self) -> bool:
        """Whether the router's and workers' sockets use CURVE (serve/curve.py): --kv-encryption on,
        or auto with a worker_host that is not loopback or workers on a Ray cluster elsewhere."""
        from .curve import encryption_on

        return encryption_on(self.kv_encryption, self.worker_host,
                             remote_workers=self.backend == "ray" and bool(self.ray_address))

    @property
    def worker_orphan_timeout_s(self) -> float:
        return self.orphan_timeout_s if self.orphan_timeout_s is not None else 2 * self.heartbeat_timeout_s

    @property
    def split(self) -> bool:
        return self.design == "splitwise"

    def homes(self) -> list[str]:
        """The home pool of each worker, by worker id."""
        return ["prompt"] * self.prompt_workers + ["token"] * self.token_workers + ["mixed"] * self.mixed_workers

    def validate(self) -> None:
        """Each setting, alone and with the others: the first that is wrong is one UserError."""
        check_workers(self)
        check_placement(self)
        check_limits(self)

    def check_host(self) -> None:
        """What this host must offer before any worker starts: a tp the model's heads can take and
        the devices the workers run on (when they run here: enough GPUs for every group). The HTTP
        port is `listen`'s."""
        self.check_tp()
        self.check_device()

    def check_device(self) -> None:
        if self.worker_mode != "engine" or (self.backend == "ray" and self.ray_address):
            return                  # echo workers compute nothing; a Ray cluster's may be elsewhere
        if self.device == "auto":
            from .gpus import gpus_present
            if self.cuda_graphs and not gpus_present():
                raise UserError("--cuda-graphs needs CUDA workers, but --device auto runs them on the CPU "
                                "here: use --device cuda on a host with a GPU, or leave --cuda-graphs out")
            self.share_gpus()
            return
        if self.device == "cpu":
            return              # without importing torch (~1 s of each start)
        import torch

        try:
            dev = torch.device(self.device)
        except (RuntimeError, ValueError):
            raise UserError(f"--device must be cpu, cuda, cuda:N or auto, got {self.device!r}") from None
        if dev.type == "cpu":
            return
        if dev.type != "cuda":
            raise UserError(f"--device must be cpu, cuda, cuda:N or auto, got {self.device!r}")
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise UserError(f"--device {self.device}: no CUDA device on this host (torch "
                            f"{torch.__version__}{'' if torch.version.cuda else ', a CPU-only build'}); "
                            f"use --device cpu or auto")
        if dev.index is not None and dev.index >= n:
            raise UserError(f"--device {self.device}: this host has {n} CUDA device{'s' if n > 1 else ''} "
                            f"(cuda:0..cuda:{n - 1})")
        if dev.index is None:
            self.share_gpus()

    def share_gpus(self) -> None:
        """Local CUDA workers: this host's GPUs, to share out by worker (gpus.py), checked to be
        enough for every group; none (as before) on a Ray backend, whose actors ask Ray for theirs."""
        from .gpus import assign, gpus_present

        ids = tuple(gpus_present()) if self.backend == "local" else ()
        if ids:
            assign(self.homes(), self.worker_tps(), len(ids), share=self.transport != "nccl")   # UserError: too few
        self.gpu_ids = ids

    def listen(self) -> socket.socket:
        """The HTTP socket, bound now, before any worker starts, as uvicorn would bind it
        (SO_REUSEADDR, so a port in TIME_WAIT passes); uvicorn serves on it. Bound first, a busy port
        is one error line before the workers start, and nothing started after (a worker's or a
        tensor-parallel group's ephemeral ports) can take it. --port 0: any free port."""
        try:
            family, kind, proto, _, addr = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)[0]
        except socket.gaierror as e:
            raise UserError(f"--host {self.host}: cannot resolve it ({e.strerror})") from None
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as e:
            sock.close()
            why = ("another process listens on it; pick another --port, or --port 0 for any free one"
                   if e.errno == errno.EADDRINUSE else e.strerror)
            raise UserError(f"--port {self.port}: cannot listen on {self.host}:{self.port}: {why}") from None
        return sock


def check_workers(cfg: ServeConfig) -> None:
    """The design, its pools and their tensor parallelism, the backend and the kind of worker."""
    if cfg.design not in ("splitwise", "baseline"):
        raise UserError(f"--design must be splitwise or baseline, got {cfg.design!r}")
    for name in ("prompt_workers", "token_workers", "mixed_workers"):
        if getattr(cfg, name) < 0:
            raise UserError(f"--{name.replace('_', '-')} must be >= 0")
    if cfg.split and (cfg.prompt_workers < 1 or cfg.token_workers < 1):
        raise UserError("--design splitwise needs at least one prompt and one token worker "
                        "(or use --design baseline with --mixed-workers)")
    if not cfg.homes():
        raise UserError("no workers: give --mixed-workers N (or prompt/token workers)")
    if cfg.backend not in ("local", "ray"):
        raise UserError(f"--backend must be local or ray, got {cfg.backend!r}")
    if cfg.worker_mode not in ("engine", "echo"):
        raise UserError(f"--worker-mode must be engine or echo, got {cfg.worker_mode!r}")
    if min(cfg.tp, cfg.prompt_tp or 1, cfg.token_tp or 1) < 1:
        raise UserError("--tp, --prompt-tp and --token-tp must be at least 1")
    if not cfg.split and (cfg.prompt_tp is not None or cfg.token_tp is not None):
        raise UserError("--prompt-tp and --token-tp set the prompt and token pools; --design baseline runs "
                        "one mixed pool: give --tp")


def check_placement(cfg: ServeConfig) -> None:
    """Where the workers run and how their KV moves: devices, transport, encryption, CUDA graphs."""
    big = max(cfg.worker_tps())
    if cfg.transport == "local" and big > 1:
        raise UserError(f"--transport local writes KV into one process's cache, and a worker at tp {big} is "
                        f"{big} processes: use --transport tcp (or nccl) with tensor parallelism")
    if big > 1 and cfg.device.startswith("cuda:") and cfg.backend == "local":
        raise UserError(f"--device {cfg.device} puts every worker on one GPU; a worker at tp {big} needs {big} "
                        f"of its own: use --device cuda (each worker gets its own GPUs)")
    if cfg.transport not in ("tcp", "local", "nccl"):
        raise UserError(f"--transport must be tcp, local or nccl, got {cfg.transport!r}")
    if cfg.transport == "nccl":  # kv/collective.py
        if cfg.worker_mode == "echo":
            raise UserError("--transport nccl moves the workers' KV; echo workers have none: use --transport tcp")
        if cfg.backend == "local" and cfg.device.startswith("cuda:"):
            raise UserError(f"--transport nccl: --device {cfg.device} puts every worker on one GPU, and NCCL "
                            f"cannot join two ranks on one GPU: use --device cuda (a GPU per worker) or "
                            f"--transport local")
        if cfg.kv_encrypted():
            raise UserError("--transport nccl sends KV unencrypted (gloo/NCCL), but --kv-encryption is on (auto: "
                            "workers off loopback): use --transport tcp, or --kv-encryption off on a trusted network")
    if cfg.backend == "ray" and cfg.device.startswith("cuda:"):
        raise UserError(f"--device {cfg.device}: with --backend ray, Ray gives each worker its own GPU "
                        f"(CUDA_VISIBLE_DEVICES); use --device cuda")
    if cfg.transport == "local":
        if cfg.backend == "ray" and cfg.ray_address:
            raise UserError("--transport local needs every worker on this host, but --ray-address may "
                            "place them on other hosts: use --transport tcp (or drop --ray-address to run "
                            "a local Ray instance)")
        if cfg.worker_mode == "echo":
            raise UserError("--transport local writes into the workers' KV caches; echo workers have "
                            "none: use --transport tcp")
    if cfg.cuda_graphs and (cfg.worker_mode == "echo" or cfg.device == "cpu"):
        raise UserError("--cuda-graphs needs CUDA workers (--device cuda, or auto on a host with a GPU), "
                        f"not {'echo workers' if cfg.worker_mode == 'echo' else '--device cpu'}")
    if cfg.kernels not in KERNEL_CHOICES:
        raise UserError(f"--kernels must be {', '.join(KERNEL_CHOICES)}, got {cfg.kernels!r}")
    if cfg.kernels == "triton" and (cfg.worker_mode == "echo" or cfg.device == "cpu"):
        raise UserError("--kernels triton needs CUDA workers (--device cuda, or auto on a host with a GPU), "
                        f"not {'echo workers' if cfg.worker_mode == 'echo' else '--device cpu'}")
    if cfg.kv_encryption not in ("auto", "on", "off"):
        raise UserError(f"--kv-encryption must be auto, on or off, got {cfg.kv_encryption!r}")


def check_limits(cfg: ServeConfig) -> None:
    """Timeouts, request limits, the queue and the port; what only the simulator does."""
    if min(cfg.transfer_timeout_s, cfg.heartbeat_timeout_s, cfg.worker_orphan_timeout_s,
           cfg.startup_timeout_s) <= 0 or cfg.drain_timeout_s < 0:
        raise UserError("--transfer-timeout, --heartbeat-timeout, --orphan-timeout and --worker-start-timeout "
                        "must be > 0 seconds, --drain-timeout >= 0")
    lim = cfg.limits
    if min(lim.max_body_bytes, lim.max_stop_strings, lim.max_stop_chars) < 1:
        raise UserError("--max-body-mb, --max-stop-strings and --max-stop-chars must be positive")
    if cfg.policy.routing.kv_pull:
        raise UserError("--kv-pull is simulated only: the live router reserves token-side KV before the "
                        "prefill (push); leave --kv-pull out of serve")
    if cfg.log_stats_interval_s < 0:
        raise UserError(f"--log-stats-interval must be >= 0 seconds (0: off), got {cfg.log_stats_interval_s:g}")
    if cfg.max_queue < 1:
        raise UserError("--max-queue must be at least 1")
    if not 0 <= cfg.port < 65536:
        raise UserError(f"--port must be in 0..65535, got {cfg.port}")
