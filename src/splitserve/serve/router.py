"""The router: admits requests, routes them with the cluster policy, follows them to their end.

It runs on the front end's event loop. `submit` admits a request (bounded: `Overloaded` past
`max_queue` requests in flight, `TooLarge` when no worker could ever hold it, `Unavailable` when
no worker can serve or the server is draining), asks `LiveCluster` (the simulator's policy code)
for its prompt and token workers, and sends the work (request_flow.py).

Each try of a request, and each placement of a resumed one, has its own wire id (`<id>.<n>`), so
anything a dead, aborted or earlier placement still says is ignored. Workers are started, watched
and replaced by the Supervisor; messages travel on the RouterChannel. When a worker dies, every
request it touched is restarted on the others (from the start; tokens the client already has are
checked, not sent twice), at most `max_attempts` times. A request that finds no live worker waits
up to `park_timeout_s` for one. A request in a failed engine step is retried isolated, and
quarantined after a second (reports.py, the reactions to worker messages). Restarts, a preempted
decode sent back through the prompt pool and the liveness monitor are in recovery.py; the workers'
prefix caches' view in prefix_view.py.

The Router owns its state (router_state.py `RouterState`, typed in one place) and the parts that
act on it, each holding that state and the parts it calls: `flow` (RequestFlow), `watch`
(RouterWatch), `recovery` (Recovery: flow, watch), `reports` (ReportReader: flow, recovery),
`views` (RouterViews: watch).
"""

from __future__ import annotations

import asyncio
import time

from ..policy.predictor import arrival_predictor
from ..policy.state import Pool
from .channel import RouterChannel
from .cluster_state import LiveCluster
from .config import ServeConfig
from .curve import CurveKeys
from .launcher import Launcher, make_launcher
from .messages import Stop, WireParams
from .metrics import ServeMetrics
from .protocol import ROUTER_NAME, Codec, boot_id, control_message_limit, new_secret
from .recovery import Recovery
from .reports import ReportReader
from .request_flow import RequestFlow
from .requests import LiveRequest
from .router_state import RouterState
from .router_views import RouterViews
from .router_watch import RouterWatch
from .stats_log import StatsLog
from .supervisor import Supervisor, WorkerInfo
from .worker_args import worker_argv

POOLS = {"prompt": Pool.PROMPT, "token": Pool.TOKEN, "mixed": Pool.MIXED}


def full(router: Router) -> bool:
    """Whether a request now would be refused as Overloaded (max_queue requests in flight)."""
    return len(router.state.reqs) >= router.cfg.max_queue


class Overloaded(Exception):
    """Too many requests in flight: shed this one (HTTP 429)."""


class Unavailable(Exception):
    """No worker can serve now (HTTP 503)."""


class TooLarge(Exception):
    """No worker of this cluster could ever hold the request (HTTP 400)."""


class Router:
    """The router: its state and its parts (the module docstring), the lifecycle and admission."""

    def __init__(self, cfg: ServeConfig, metrics: ServeMetrics | None = None) -> None:
        self.cfg = cfg
        self.secret = new_secret()
        curve = CurveKeys.from_secret(self.secret) if cfg.kv_encrypted() else None  # curve.py
        self.state = s = RouterState(cfg, metrics or ServeMetrics(cfg.model),
                                     RouterChannel(Codec(self.secret, ROUTER_NAME), curve), boot_id(),
                                     [WorkerInfo(i, home) for i, home in enumerate(cfg.homes())])
        self.flow = RequestFlow(s)
        self.watch = RouterWatch(s)
        self.recovery = Recovery(s, self.flow, self.watch)
        self.reports = ReportReader(s, self.flow, self.recovery)
        self.views = RouterViews(s, self.watch)
        self._tasks: list[asyncio.Task] = []
        self._max_request = 0

    @property
    def address(self) -> str:
        return self.state.chan.address

    @property
    def active(self) -> dict[int, LiveRequest]:
        return self.state.reqs.active

    @property
    def workers(self) -> list[WorkerInfo]:
        return self.state.workers

    @property
    def cluster(self) -> LiveCluster | None:
        return self.state.cluster

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        s, cfg = self.state, self.cfg
        s.chan.open(cfg.worker_host, control_message_limit(cfg.max_model_len(), cfg.max_num_seqs),
                    self._lookup, self.reports.on_message)
        launcher = make_launcher(cfg.backend, self.secret, cfg.ray_address)
        s.sup = Supervisor(cfg, self.secret, launcher, lambda w: worker_argv(cfg, w, self.address),
                           self.recovery.worker_down, self._launched)
        s.workers = s.sup.workers
        await self._workers_up(launcher)
        homes = [POOLS[w.home] if cfg.split else Pool.MIXED for w in s.workers]
        s.cluster = LiveCluster(homes, [w.kv_tokens for w in s.workers], cfg.split, cfg.policy.routing,
                                s.workers[0].block_size, arrival_predictor(cfg.policy), cfg.policy.batching,
                                prefix=cfg.prefix_caching and cfg.worker_mode == "engine")  # prefix_view.py
        self.max_request_tokens()
        self._tasks.append(asyncio.create_task(self.recovery.monitor_loop()))
        if cfg.log_stats_interval_s > 0:
            self._tasks.append(asyncio.create_task(StatsLog(s.metrics).run(self, cfg.log_stats_interval_s)))
        s.ready = True

    async def _workers_up(self, launcher: Launcher) -> None:
        """Launch every worker and wait until each said hello; at start, any failure is fatal (bad config)."""
        s, cfg = self.state, self.cfg
        now = time.monotonic()
        for w in s.workers:
            s.supervisor.launch(w, now)
        deadline = now + cfg.startup_timeout_s
        while not all(w.up for w in s.workers):
            s.chan.drain_all()
            for w in s.workers:
                if not w.up and not launcher.alive(w.handle):
                    raise RuntimeError(f"worker {w.id} exited during startup (see its error above)")
            if time.monotonic() > deadline:
                late = [w.id for w in s.workers if not w.up]
                raise RuntimeError(f"workers {late} did not start within {cfg.startup_timeout_s:g} s "
                                   f"(--worker-start-timeout)")
            await asyncio.sleep(0.05)

    def _lookup(self, ident: bytes) -> WorkerInfo | None:
        sup = self.state.sup
        return sup.by_ident.get(ident) if sup is not None else None

    def _launched(self, w: WorkerInfo) -> None:
        if w.restarts:
            self.state.metrics.splitwise.worker_restarts.inc()

    def drain(self) -> None:
        """Shutdown begins: admit nothing new (503); what is in flight may finish."""
        self.state.draining = True

    def fail_all(self, why: str) -> None:
        """End every request in flight with an error (a stream's last event, then [DONE])."""
        for req in list(self.state.reqs.active.values()):
            self.flow.fail(req, why, 503)

    async def stop(self) -> None:
        s = self.state
        s.closing = True
        self.fail_all("the server is shutting down")
        for w in s.workers:
            if w.up:
                s.chan.send(w, Stop())
        await asyncio.sleep(0.05)
        for t in self._tasks:
            t.cancel()
        if s.sup is not None:
            s.sup.stop()
        s.chan.close()

    # ---- admission ---------------------------------------------------------------------------
    def max_request_tokens(self) -> int:
        """Tokens (prompt and output) one request may hold: what the smallest worker that may have
        to hold all of it can (its context and KV cache), as they said at start."""
        if not self._max_request:
            s = self.state
            flips = s.cluster.view.cls.watch_interval if s.cluster is not None else 0
            holders = [w for w in s.workers if w.home != "prompt" or not self.cfg.split or flips]
            self._max_request = min(min(w.max_len, w.kv_tokens) for w in holders)
        return self._max_request

    def submit(self, prompt_ids: list[int], params: WireParams, name: str = "", queue=None,
               cache_key: int = -1) -> LiveRequest:
        """Admit one request; its events go to `queue` (its own asyncio.Queue when None); `cache_key`:
        its prompt cache key's hash (policy/prefix_routing.py), -1: none."""
        s = self.state
        if not s.ready or s.closing or s.draining:
            raise Unavailable("the server is starting or shutting down")
        if full(self):
            raise Overloaded(f"{len(s.reqs)} requests in flight (limit {self.cfg.max_queue})")
        need = len(prompt_ids) + params.max_tokens
        if need > self._max_request:
            raise TooLarge(f"the request needs {need} tokens of KV cache (prompt {len(prompt_ids)} + "
                           f"max_tokens {params.max_tokens}); a worker holds at most {self._max_request}")
        if not any(w.up for w in s.workers):
            raise Unavailable("no worker is up")
        req = s.reqs.new(name, prompt_ids, params, time.perf_counter(), queue)
        req.cache_key = cache_key
        self.flow.begin(req)
        return req

    def cancel(self, req: LiveRequest) -> None:
        """The client went away: stop the work."""
        self.flow.cancel(req)
