"""A worker's command line: built by the router (`worker_argv`), read by the worker (`parse_args`).
One place for both ends, so they cannot drift apart. The cluster secret is not on it (it comes in
the environment, protocol.SECRET_ENV), nor the worker's identity (derived from the secret)."""

from __future__ import annotations

import argparse
import os

from ..engine.kernels import KERNEL_CHOICES
from ..policy.config import PolicyConfig
from .config import ServeConfig
from .gpus import worker_devices


def worker_argv(cfg: ServeConfig, w, router_address: str) -> list[str]:
    """The arguments of worker `w` (a supervisor.WorkerInfo) of the cluster `cfg`: its pool's --tp
    and, for a local CUDA worker, its own GPUs (gpus.py: --gpus, which the launcher makes its
    CUDA_VISIBLE_DEVICES, or --device cuda:N with --transport local)."""
    device, visible = worker_devices(cfg.homes(), cfg.worker_tps(), cfg.gpu_ids, w.id, cfg.transport == "local")
    argv = ["--id", str(w.id), "--gen", str(w.gen), "--router", router_address, "--model", cfg.model,
            "--host", cfg.worker_host, "--device", device or cfg.device, "--dtype", cfg.dtype,
            "--tp", str(cfg.pool_tp(w.home)),
            "--seed", str(cfg.seed), "--max-num-seqs", str(cfg.max_num_seqs),
            "--threads", str(cfg.worker_threads), "--transport", cfg.transport,
            "--transfer-timeout-s", str(cfg.transfer_timeout_s), "--worker-mode", cfg.worker_mode,
            "--kv-encryption", "on" if cfg.kv_encrypted() else "off",
            "--orphan-timeout-s", str(cfg.worker_orphan_timeout_s), "--policy", cfg.worker_policy().to_json()]
    if visible is not None:
        argv += ["--gpus", visible]
    if cfg.cuda_graphs:
        argv += ["--cuda-graphs"]
    argv += ["--kernels", cfg.kernels]
    if not cfg.prefix_caching:
        argv += ["--no-prefix-caching"]
    if cfg.echo_token_delay_s:
        argv += ["--echo-token-delay-s", str(cfg.echo_token_delay_s)]
    if cfg.num_blocks:
        argv += ["--num-blocks", str(cfg.num_blocks)]
    if cfg.pin_workers:
        argv += ["--cpus", ",".join(map(str, worker_cpus(w.id, cfg.worker_threads)))]
    if cfg.step_log_dir:
        argv += ["--step-log", f"{cfg.step_log_dir}/worker-{w.id}.jsonl"]
    if cfg.debug_layer_delay_s and w.home == "prompt":
        argv += ["--debug-layer-delay-s", str(cfg.debug_layer_delay_s)]
    if cfg.debug_fail_token is not None:
        argv += ["--debug-fail-token", str(cfg.debug_fail_token)]
    return argv


def worker_cpus(worker: int, threads: int, cpus: list[int] | None = None) -> list[int]:
    """The cores a pinned CPU worker runs on (`serve --pin-workers`): worker i takes the `threads`
    cores after worker i-1's, round the cores this process may use (`cpus`, default its affinity):
    with more workers than cores, workers i and i + cores/threads share theirs."""
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else cpus
    return [cpus[(worker * threads + j) % len(cpus)] for j in range(min(threads, len(cpus)))]


def set_host(argv: list[str], host: str) -> list[str]:
    """`argv` with the address to bind the inbound KV endpoint on replaced by `host` (a Ray worker
    on another node binds its node's IP)."""
    i = argv.index("--host")
    return [*argv[:i + 1], host, *argv[i + 2:]]


def parse_args(argv=None, description: str = "a splitserve worker") -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="splitserve-worker", description=description)
    ap.add_argument("--id", type=int, required=True)
    ap.add_argument("--gen", type=int, default=1, help="generation (the router's launch count of this worker id)")
    ap.add_argument("--router", required=True, help="the router's control endpoint, tcp://host:port")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind the inbound KV endpoint on")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel processes of this worker, one per device")
    ap.add_argument("--gpus", default=None, help="the GPUs the launcher gave this worker (its CUDA_VISIBLE_DEVICES)")
    ap.add_argument("--cuda-graphs", action="store_true", help="replay decode-only steps from CUDA graphs")
    ap.add_argument("--kernels", default="torch", choices=KERNEL_CHOICES, help="the layers' kernels (engine/kernels.py)")
    ap.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false",
                    help="compute every prompt whole (no K/V shared between requests)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-blocks", type=int, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cpus", type=lambda v: [int(c) for c in v.split(",")], default=None,
                    help="run on these cores only (comma-separated; the router's --pin-workers)")
    ap.add_argument("--policy", type=PolicyConfig.from_json, default=PolicyConfig(),
                    help="the scheduling policies' settings, as JSON (the router's PolicyConfig)")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--transfer-timeout-s", type=float, default=5.0)
    ap.add_argument("--kv-encryption", choices=["auto", "on", "off"], default="auto",
                    help="CURVE on the control and KV sockets (serve/curve.py); the router passes on or off, "
                         "as it decided for the whole cluster")
    ap.add_argument("--orphan-timeout-s", type=float, default=10.0)
    ap.add_argument("--step-log", default=None, help="append a JSON line per engine step to this file: start "
                    "(unix time), seconds, and (KV tokens before, tokens) of each sequence")
    ap.add_argument("--worker-mode", choices=["engine", "echo"], default="engine")
    ap.add_argument("--echo-token-delay-s", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--debug-layer-delay-s", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--debug-fail-token", type=int, default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)
