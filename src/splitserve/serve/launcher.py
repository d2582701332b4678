"""Starting, watching and stopping worker processes: here (`local`) or on a Ray cluster (`ray`).

A launcher turns a worker id and its argument list into a running worker and answers whether it
is still alive. Local workers are child processes (`python -m splitserve.serve.worker ...`) in
their own session, killed with the server; a CUDA worker's process sees only its own GPUs (its
`--gpus`, made its CUDA_VISIBLE_DEVICES: gpus.py). Ray workers are one actor each, whose `run` method is
the worker's main loop; the router finds them by their `hello`.

Ray: `join_ray` (the serve command, before the server starts) starts or joins Ray
(ray_cluster.connect), checks that every node runs this splitserve and that the cluster has the
GPUs the workers ask for. A worker at tensor parallel `tp` (its pool's --tp) is one actor, whose
engine spawns its tp-1 follower processes on the actor's node: it asks for `tp` GPUs when it runs
on CUDA (`--device cuda`, or `auto` on a cluster that has GPUs), and `tp` CPUs. One actor's
resources come from one node, so a group is packed on one node with its GPUs, as a placement
group of one `tp`-GPU bundle (STRICT_PACK) would place it; Ray sets the actor's
CUDA_VISIBLE_DEVICES to them and the followers inherit it. Actors are placed with Ray's SPREAD
strategy (over the nodes that have the resources, one after another). Joined to a cluster (`--ray-address`), each worker
binds its KV endpoint on the IP Ray knows its node by, so workers on other nodes can reach it; the
router binds `--worker-host`, by default this host's IP as the cluster sees it (cli/serve.py). On
a local Ray instance every worker binds `--worker-host` (127.0.0.1 by default). The launcher logs
the node each worker runs on, and at shutdown stops every actor and Ray.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from typing import Any, Protocol

from .. import logs
from ..errors import UserError
from .protocol import SECRET_ENV

logger = logging.getLogger(__name__)


class Launcher(Protocol):
    """What the supervisor asks of a launcher. A handle is the launcher's own (a Popen; a Ray
    actor and its calls' refs): the supervisor keeps it in WorkerInfo.handle and hands it back."""

    def start(self, wid: int, argv: list[str]) -> Any: ...
    def alive(self, handle: Any) -> bool: ...
    def pid(self, handle: Any) -> int | None: ...
    def kill(self, handle: Any) -> None: ...
    def close(self) -> None: ...


class LocalLauncher:
    def __init__(self, secret: bytes) -> None:
        self.env = {**os.environ, SECRET_ENV: secret.hex()}
        self.env.setdefault("OMP_NUM_THREADS", "1")

    def start(self, wid: int, argv: list[str]) -> subprocess.Popen:
        env = self.env
        if "--gpus" in argv:     # its own GPUs (gpus.py)
            env = {**env, "CUDA_VISIBLE_DEVICES": argv[argv.index("--gpus") + 1]}
        return subprocess.Popen([sys.executable, "-m", "splitserve.serve.worker", *argv], env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    @staticmethod
    def alive(handle: subprocess.Popen) -> bool:
        return handle.poll() is None

    @staticmethod
    def pid(handle: subprocess.Popen) -> int | None:
        return handle.pid

    @staticmethod
    def kill(handle: subprocess.Popen) -> None:
        if handle.poll() is None:
            try:
                os.kill(handle.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            handle.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        pass


def wants_gpu(device: str, cluster_gpus: float) -> bool:
    """Whether a Ray worker on `device` asks for a GPU: cuda always, auto when the cluster has one."""
    return device.startswith("cuda") or (device == "auto" and cluster_gpus > 0)


def actor_resources(device: str, cluster_gpus: float, tp: int = 1) -> dict:
    """The resources one worker's actor asks Ray for: a GPU and a CPU per process of its group."""
    return {"num_gpus": tp, "num_cpus": tp} if wants_gpu(device, cluster_gpus) else {"num_cpus": tp}


def ray_fit_check(cfg, cluster: dict, nodes: list[dict]) -> str | None:
    """Why the Ray cluster (its total resources, and each node's) cannot hold the workers (None:
    it can): every group's `tp` GPUs on one node, and all of them in the cluster; the same for the
    CPUs of CPU groups at tp > 1 (CPU workers at tp 1 ask one CPU each, unchecked, as before)."""
    tps = cfg.worker_tps()
    gpu = wants_gpu(cfg.device, cluster.get("GPU", 0))
    if not gpu and max(tps) == 1:
        return None
    from .gpus import describe, groups_of

    kind = "GPU" if gpu else "CPU"
    have, most = cluster.get(kind, 0), max((nd.get(kind, 0) for nd in nodes), default=0)
    if sum(tps) > have:
        return (f"--device {cfg.device}: {describe(groups_of(cfg.homes(), tps))} ask Ray for {sum(tps)} {kind}s; "
                f"the Ray cluster has {have:g}: give fewer workers, a smaller tp, more nodes"
                + (" or --device cpu" if gpu else ""))
    if max(tps) > most:
        return (f"--device {cfg.device}: a worker at tp {max(tps)} needs {max(tps)} {kind}s on one node; the Ray "
                f"cluster's largest node has {most:g}: give a smaller tp")
    return None


def join_ray(cfg, log=None) -> None:
    """Before the server starts: start or join Ray, every node's splitserve checked, and the GPUs
    the workers ask for there (each failure one error line)."""
    from ..nodes.ray_cluster import check_nodes, connect, import_ray

    ray = import_ray()
    connect(cfg.ray_address, log_to_driver=True)
    nodes = check_nodes()
    cluster = ray.cluster_resources()
    gpus = cluster.get("GPU", 0)
    n = len(cfg.homes())
    why = ray_fit_check(cfg, cluster, [nd.get("Resources", {}) for nd in nodes])
    if why:
        ray.shutdown()
        raise UserError(why)
    if log:
        per = "GPU" if wants_gpu(cfg.device, gpus) else "CPU"
        log(f"Ray: {len(nodes)} node{'s' * (len(nodes) != 1)}, each with this splitserve; {n} workers, "
            f"one {per} per tensor-parallel process, each worker's group on one node, spread over the nodes")


def ray_env(secret: bytes) -> dict[str, dict[str, str]]:
    """A Ray worker actor's runtime_env: the channel's secret and, where set, the log level (Ray
    starts actors from its own processes, which do not inherit this one's environment)."""
    env = {SECRET_ENV: secret.hex()}
    if logs.ENV in os.environ:
        env[logs.ENV] = os.environ[logs.ENV]
    return {"env_vars": env}


class RayLauncher:
    def __init__(self, secret: bytes, address: str | None) -> None:
        from ..nodes.ray_cluster import connect, import_ray, is_local

        ray = self.ray = import_ray()
        connect(address, log_to_driver=True)   # joined already by join_ray (the serve command)
        self.env = ray_env(secret)
        self.node_ip = not is_local(address)    # workers on other hosts bind their node's IP
        self.gpus = ray.cluster_resources().get("GPU", 0)
        self.placed: dict[int, str] = {}        # worker id -> the node it runs on, once known

        @ray.remote(max_restarts=0)
        class WorkerActor:
            def where(self) -> tuple[str, str]:
                return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

            def run(self, argv: list[str], node_ip: bool) -> int:
                from splitserve.serve.worker import main
                from splitserve.serve.worker_args import set_host
                return main(set_host(argv, ray.util.get_node_ip_address()) if node_ip else argv)

        self.actor_cls: Any = WorkerActor  # a Ray ActorClass (mypy does not apply class decorators)

    def start(self, wid: int, argv: list[str]):
        from .worker_args import parse_args

        args = parse_args(argv)
        res = actor_resources(args.device, self.gpus, args.tp)
        actor = self.actor_cls.options(scheduling_strategy="SPREAD", runtime_env=self.env, **res).remote()
        return (wid, actor, actor.where.remote(), actor.run.remote(argv, self.node_ip))

    def alive(self, handle) -> bool:
        wid, _, where, ref = handle
        if self.placed.get(wid) != where.hex():
            done, _ = self.ray.wait([where], timeout=0)
            if done:
                self.placed[wid] = where.hex()
                node, ip = self.ray.get(where)
                logger.info("router: worker %s runs on Ray node %s (%s)", wid, node[:12], ip)
        done, _ = self.ray.wait([ref], timeout=0)
        return not done

    @staticmethod
    def pid(handle) -> int | None:
        return None

    def kill(self, handle) -> None:
        _, actor, _, _ = handle
        try:
            self.ray.kill(actor, no_restart=True)
        except (self.ray.exceptions.RayError, ValueError, OSError) as e:
            # an actor gone already is fine: Ray's own errors, and the ValueError and OSError its core
            # worker raises for what it cannot do
            logger.debug("router: Ray could not kill an actor: %r", e)

    def close(self) -> None:
        """After the supervisor killed every actor: Ray down too (a local instance stops)."""
        if self.ray.is_initialized():
            self.ray.shutdown()
            logger.info("router: Ray workers stopped; Ray shut down")


def make_launcher(backend: str, secret: bytes, ray_address: str | None) -> Launcher:
    if backend == "ray":
        return RayLauncher(secret, ray_address)
    return LocalLauncher(secret)
