"""Starting, watching and stopping worker processes: here (`local`) or on a Ray cluster (`ray`).

A launcher turns a worker id and its argument list into a running worker and answers whether it
is still alive. Local workers are child processes (`python -m splitserve.serve.worker ...`) in
their own session, killed with the server. Ray workers are one actor each (`num_cpus=1`), whose
`run` method is the worker's main loop; the router finds them by their `hello`, so the router's
`--worker-host` must be an address the Ray nodes can reach.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from ..errors import UserError
from .protocol import SECRET_ENV


class LocalLauncher:
    def __init__(self, secret: bytes) -> None:
        self.env = {**os.environ, SECRET_ENV: secret.hex()}
        self.env.setdefault("OMP_NUM_THREADS", "1")

    def start(self, wid: int, argv: list[str]) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "splitserve.serve.worker", *argv], env=self.env,
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


class RayLauncher:
    def __init__(self, secret: bytes, address: str | None) -> None:
        try:
            import ray
        except ImportError:
            raise UserError("--backend ray needs ray: pip install 'splitserve[ray]'") from None
        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=True,
                     runtime_env={"env_vars": {SECRET_ENV: secret.hex()}})

        @ray.remote(num_cpus=1, max_restarts=0)
        class WorkerActor:
            def run(self, argv: list[str]) -> int:
                from splitserve.serve.worker import main
                return main(argv)

        self.actor_cls = WorkerActor

    def start(self, wid: int, argv: list[str]):
        actor = self.actor_cls.options(name=None).remote()
        return (actor, actor.run.remote(argv))

    def alive(self, handle) -> bool:
        _, ref = handle
        done, _ = self.ray.wait([ref], timeout=0)
        return not done

    @staticmethod
    def pid(handle) -> int | None:
        return None

    def kill(self, handle) -> None:
        actor, _ = handle
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception:
            pass

    def close(self) -> None:
        pass


def make_launcher(backend: str, secret: bytes, ray_address: str | None):
    if backend == "ray":
        return RayLauncher(secret, ray_address)
    return LocalLauncher(secret)
