"""Supervision of the worker processes: start them, watch them, replace them, and say whether the
cluster can serve.

Each worker slot (`WorkerInfo`, one per configured worker) is in one state:

    STARTING  launched; it must say hello within `startup_timeout_s` or it is killed and relaunched
    UP        said hello; it must not be silent for `heartbeat_timeout_s` (silence: killed)
    DOWN      died (process exit, silence, start-up failure); relaunched at `retry_at`
    OFF       not relaunched (--no-restart-workers, or the server is stopping)

Relaunches never stop: there is no replacement budget a client could spend. A slot that keeps
failing waits longer each time (back-off: 0 s, then 0.5 s doubling up to `MAX_BACKOFF_S`); a
worker that stayed up for `STABLE_S` resets its back-off. Each launch is a new generation with a
new ZeroMQ identity derived from the cluster secret (protocol.worker_identity), so nobody without
the secret can take a worker's identity, and messages from an older generation are dropped.

Nothing here touches requests: the router learns of a death through `on_down` and restarts what
the dead worker held. Time comes in as arguments (`now`, monotonic seconds), so tests can drive it.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .config import ServeConfig
from .protocol import worker_identity

if TYPE_CHECKING:
    from .launcher import Launcher

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
STABLE_S = 60.0


class State(enum.Enum):
    STARTING = "starting"
    UP = "up"
    DOWN = "down"
    OFF = "off"


@dataclass(eq=False)
class WorkerInfo:
    id: int
    home: str
    state: State = State.DOWN
    handle: object = None
    ident: bytes = b""
    gen: int = 0
    pid: int | None = None
    kv_addr: str = ""
    kv_region: dict | None = None  # --transport local: its KV cache as a same-host peer maps it
    same_clock: bool = False       # its time.perf_counter() is the router's (same boot): `step`'s `at` holds
    blocks: int = 0
    block_size: int = 16
    free: int = 0
    start_free: int = 0
    reserved: int = 0
    running: int = 0
    rejected: int = 0
    preempted: int = 0         # decodes its engine preempted (machine-level policy), this process
    max_len: int = 0           # tokens one request may hold there (context and KV cache)
    last_seen: float = 0.0
    started_at: float = 0.0
    up_since: float = 0.0
    retry_at: float = 0.0
    failures: int = 0          # consecutive failures since it was last up for STABLE_S
    restarts: int = 0
    last_failure: str = ""

    @property
    def up(self) -> bool:
        return self.state is State.UP

    @property
    def kv_tokens(self) -> int:
        """Its KV cache in tokens (the policy reserves whole blocks: Machine.kv_block)."""
        return self.blocks * self.block_size


class Supervisor:
    def __init__(self, cfg: ServeConfig, secret: bytes, launcher: Launcher, argv: Callable[[WorkerInfo], list[str]],
                 on_down: Callable[[WorkerInfo, str], None], on_launch: Callable[[WorkerInfo], None]) -> None:
        """argv(w): the worker's command line (without its identity: the worker derives it);
        on_down(w, why): w left UP (the router restarts its requests); on_launch(w): a new
        generation of w is starting (its identity changed)."""
        self.cfg, self.secret, self.launcher = cfg, secret, launcher
        self.argv, self.on_down, self.on_launch = argv, on_down, on_launch
        self.workers = [WorkerInfo(i, home) for i, home in enumerate(cfg.homes())]
        self.by_ident: dict[bytes, WorkerInfo] = {}
        self.closing = False

    # ---- transitions ---------------------------------------------------------------------------
    def launch(self, w: WorkerInfo, now: float) -> None:
        self.by_ident.pop(w.ident, None)
        w.gen += 1
        w.ident = worker_identity(self.secret, w.id, w.gen)
        self.by_ident[w.ident] = w
        w.state, w.started_at, w.last_seen = State.STARTING, now, now
        w.handle = self.launcher.start(w.id, self.argv(w))
        w.pid = self.launcher.pid(w.handle)
        self.on_launch(w)

    def hello(self, w: WorkerInfo, pid: int | None, now: float) -> bool:
        """w's current generation said hello; False if it is not the process we started."""
        if w.state is not State.STARTING or (w.pid is not None and pid != w.pid):
            return False
        w.state, w.up_since, w.last_seen = State.UP, now, now
        return True

    def fail(self, w: WorkerInfo, why: str, now: float) -> None:
        """w died or must die: kill it, tell the router if it was up, schedule its relaunch."""
        was_up = w.state is State.UP
        logger.warning("router: worker %d (%s) is down: %s", w.id, w.home, why)
        self.launcher.kill(w.handle)
        if was_up and now - w.up_since >= STABLE_S:
            w.failures = 0
        w.failures += 1
        w.last_failure = why
        if self.cfg.restart_workers and not self.closing:
            w.state = State.DOWN
            w.retry_at = now + backoff(w.failures)
        else:
            w.state = State.OFF
        if was_up:
            self.on_down(w, why)

    def check(self, now: float) -> None:
        """Find the dead, the hung and the late starters; relaunch what is due."""
        timeout = self.cfg.heartbeat_timeout_s
        for w in self.workers:
            if w.state is State.STARTING:
                if not self.launcher.alive(w.handle):
                    self.fail(w, "its process exited while starting", now)
                elif now - w.started_at > self.cfg.startup_timeout_s:
                    self.fail(w, f"it did not start within {self.cfg.startup_timeout_s:g} s", now)
            elif w.state is State.UP:
                if not self.launcher.alive(w.handle):
                    self.fail(w, "its process exited", now)
                elif now - w.last_seen > timeout:
                    self.fail(w, f"silent for {timeout:g} s", now)
            elif w.state is State.DOWN and now >= w.retry_at and not self.closing:
                w.restarts += 1
                self.launch(w, now)

    def paused(self, seconds: float) -> None:
        """The router did not listen for `seconds` (its loop or its process stood still): that time
        is no worker's silence, nor part of anyone's start-up."""
        for w in self.workers:
            w.last_seen += seconds
            w.started_at += seconds

    def stop(self) -> None:
        """Kill every worker, then close the launcher (a Ray launcher shuts Ray down)."""
        self.closing = True
        for w in self.workers:
            if w.handle is not None:
                self.launcher.kill(w.handle)
            w.state = State.OFF
        self.launcher.close()

    # ---- views ---------------------------------------------------------------------------------
    def pools(self, split: bool) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for w in self.workers:
            p = out.setdefault(w.home if split else "mixed", {s.value: 0 for s in State})
            p[w.state.value] += 1
        return out

    def health(self, split: bool) -> tuple[bool, dict]:
        """Ready when every pool requests need (prompt and token, or mixed) has a live worker; the
        body names the pools that have none."""
        pools = self.pools(split)
        empty = [name for name, p in pools.items() if p["up"] == 0]
        body = {"status": "ok" if not empty else "unavailable", "pools": pools,
                "workers_up": sum(w.up for w in self.workers), "workers": len(self.workers)}
        if empty:
            body["reason"] = "no live worker in the " + " and ".join(empty) + " pool" + "s" * (len(empty) > 1) \
                + ("; replacements are starting" if self.cfg.restart_workers else "")
        return not empty, body


def backoff(failures: int) -> float:
    """Seconds before relaunch number `failures` of a slot: at once, then 0.5 s doubling."""
    return 0.0 if failures <= 1 else min(MAX_BACKOFF_S, 0.5 * 2 ** (failures - 2))
