"""The router: admits requests, routes them with the cluster policy, follows them to their end.

It runs on the front end's event loop. `submit` admits a request (bounded: `Overloaded` past
`max_queue` requests in flight, `TooLarge` when no worker could ever hold it, `Unavailable` when
no worker can serve or the server is draining), asks `LiveCluster` (the simulator's policy code)
for its prompt and token workers, and sends the work (docs/architecture.md: a request's life):

    unsplit (mixed worker, baseline, or one output token):  gen(kind=full) -> worker
    split:  expect -> token worker (reserve KV) ... reserved -> gen(kind=prefill) -> prompt worker;
            its first token streams to the client at once; kv_in from the token worker when the
            KV landed; then decode tokens

Each try of a request has its own wire id (`<id>.<try>`), so anything a dead or aborted try
still says is ignored. Workers are started, watched and replaced by the Supervisor; messages
travel on the RouterChannel. When a worker dies, every request it touched is restarted on the
others (from the start; tokens the client already has are checked, not sent twice), at most
`max_attempts` times. A request that finds no live worker waits up to `park_timeout_s` for one.
A request in a failed engine step is retried isolated, and quarantined after a second (reports.py,
the reactions to worker messages). Restarts, parking, a preempted decode sent back through the
prompt pool and the liveness monitor are in recovery.py; the workers' prefix caches' view in
prefix_view.py.
"""

from __future__ import annotations

import asyncio
import time

from ..policy.cluster import moves_kv
from ..policy.predictor import arrival_predictor
from ..policy.state import Pool, Request
from .channel import RouterChannel
from .cluster_state import LiveCluster, NoWorkers
from .config import ServeConfig
from .curve import CurveKeys
from .launcher import make_launcher
from .messages import Abort, Expect, Gen, Stage, Stop, WireParams
from .metrics import ServeMetrics
from .protocol import ROUTER_NAME, Codec, boot_id, control_message_limit, new_secret
from .requests import LiveRequest, RequestTable
from .recovery import Recovery
from .reports import WorkerReports
from .router_views import RouterViews
from .router_watch import RouterWatch
from .stats_log import StatsLog
from .supervisor import Supervisor, WorkerInfo
from .worker_args import worker_argv

POOLS = {"prompt": Pool.PROMPT, "token": Pool.TOKEN, "mixed": Pool.MIXED}


class Overloaded(Exception):
    """Too many requests in flight: shed this one (HTTP 429)."""


class Unavailable(Exception):
    """No worker can serve now (HTTP 503)."""


class TooLarge(Exception):
    """No worker of this cluster could ever hold the request (HTTP 400)."""


class Router(WorkerReports, Recovery, RouterWatch, RouterViews):
    def __init__(self, cfg: ServeConfig, metrics: ServeMetrics | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics or ServeMetrics(cfg.model)
        self.secret = new_secret()
        self.boot = boot_id()             # workers of the same boot share its clock (reports.py: step)
        self.curve = CurveKeys.from_secret(self.secret) if cfg.kv_encrypted() else None  # curve.py
        self.chan = RouterChannel(Codec(self.secret, ROUTER_NAME), self._lookup, self._on_message, self.curve)
        self.sup: Supervisor | None = None
        self.workers = [WorkerInfo(i, home) for i, home in enumerate(cfg.homes())]
        self.reqs = RequestTable()
        self.cluster: LiveCluster | None = None
        self._tasks: list[asyncio.Task] = []
        self._max_request, self._next_watch = 0, 0.0
        self.flips: list[dict] = []       # instance flips (--cluster-scheduler tetriinfer), in order
        self.ready = self.draining = self.closing = False

    @property
    def address(self) -> str:
        return self.chan.address

    @property
    def active(self) -> dict[int, LiveRequest]:
        return self.reqs.active

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.cfg
        self.chan.open(cfg.worker_host, control_message_limit(cfg.max_model_len(), cfg.max_num_seqs))
        launcher = make_launcher(cfg.backend, self.secret, cfg.ray_address)
        self.sup = Supervisor(cfg, self.secret, launcher, lambda w: worker_argv(cfg, w, self.address),
                              self._worker_down, self._launched)
        self.workers = self.sup.workers
        now = time.monotonic()
        for w in self.workers:
            self.sup.launch(w, now)
        deadline = now + cfg.startup_timeout_s
        while not all(w.up for w in self.workers):  # at start, any failure is fatal (bad config)
            self.chan.drain_all()
            for w in self.workers:
                if not w.up and not launcher.alive(w.handle):
                    raise RuntimeError(f"worker {w.id} exited during startup (see its error above)")
            if time.monotonic() > deadline:
                late = [w.id for w in self.workers if not w.up]
                raise RuntimeError(f"workers {late} did not start within {cfg.startup_timeout_s:g} s "
                                   f"(--worker-start-timeout)")
            await asyncio.sleep(0.05)
        homes, bs = [POOLS[w.home] if cfg.split else Pool.MIXED for w in self.workers], self.workers[0].block_size
        self.cluster = LiveCluster(homes, [w.kv_tokens for w in self.workers], cfg.split, cfg.policy.routing,
                                   bs, arrival_predictor(cfg.policy), cfg.policy.batching,
                                   prefix=cfg.prefix_caching and cfg.worker_mode == "engine")  # prefix_view.py
        self.max_request_tokens()
        self._tasks.append(asyncio.create_task(self._monitor_loop()))
        if cfg.log_stats_interval_s > 0:
            self._tasks.append(asyncio.create_task(StatsLog(self.metrics).run(self, cfg.log_stats_interval_s)))
        self.ready = True

    def _lookup(self, ident: bytes) -> WorkerInfo | None:
        return self.sup.by_ident.get(ident) if self.sup is not None else None

    def _launched(self, w: WorkerInfo) -> None:
        if w.restarts:
            self.metrics.worker_restarts.inc()

    def drain(self) -> None:
        """Shutdown begins: admit nothing new (503); what is in flight may finish."""
        self.draining = True

    def fail_all(self, why: str) -> None:
        """End every request in flight with an error (a stream's last event, then [DONE])."""
        for req in list(self.reqs.active.values()):
            self._fail(req, why, 503)

    async def stop(self) -> None:
        self.closing = True
        self.fail_all("the server is shutting down")
        for w in self.workers:
            if w.up:
                self.chan.send(w, Stop())
        await asyncio.sleep(0.05)
        for t in self._tasks:
            t.cancel()
        if self.sup is not None:
            self.sup.stop()
        self.chan.close()

    # ---- admission ---------------------------------------------------------------------------
    def max_request_tokens(self) -> int:
        """Tokens (prompt and output) one request may hold: what the smallest worker that may have
        to hold all of it can (its context and KV cache), as they said at start."""
        if not self._max_request:
            flips = self.cluster.cls.watch_interval if self.cluster is not None else 0
            holders = [w for w in self.workers if w.home != "prompt" or not self.cfg.split or flips]
            self._max_request = min(min(w.max_len, w.kv_tokens) for w in holders)
        return self._max_request

    def submit(self, prompt_ids: list[int], params: WireParams, name: str = "", queue=None) -> LiveRequest:
        """Admit one request; its events go to `queue` (its own asyncio.Queue when None)."""
        if not self.ready or self.closing or self.draining:
            raise Unavailable("the server is starting or shutting down")
        if len(self.reqs) >= self.cfg.max_queue:
            raise Overloaded(f"{len(self.reqs)} requests in flight (limit {self.cfg.max_queue})")
        need = len(prompt_ids) + params.max_tokens
        if need > self._max_request:
            raise TooLarge(f"the request needs {need} tokens of KV cache (prompt {len(prompt_ids)} + "
                           f"max_tokens {params.max_tokens}); a worker holds at most {self._max_request}")
        if not any(w.up for w in self.workers):
            raise Unavailable("no worker is up")
        req = self.reqs.new(name, prompt_ids, params, time.perf_counter(), queue)
        self._begin(req)
        return req

    def _begin(self, req: LiveRequest) -> None:
        """Route one try of `req` and send it on its way (or park it / let it wait for memory)."""
        r = self.reqs.new_try(req, time.perf_counter(), self.cluster.prefix)
        try:
            go = self.cluster.arrive(r)
        except NoWorkers as e:
            self._park(req, str(e))
            return
        self.reqs.track(req)
        if go:
            self._dispatch(req)
        else:
            req.stage = Stage.WAITING

    def _dispatch(self, req: LiveRequest) -> None:
        r = req.pr
        p, t = self.workers[r.prompt_machine], self.workers[r.token_machine]
        req.split = moves_kv(r)
        ids, params, resumed = req.work()
        if req.split:
            req.stage = Stage.RESERVING
            self.chan.send(t, Expect(rid=req.wire, prompt_ids=ids, params=params, src=p.id, isolated=req.isolated,
                                     resumed=resumed))
        else:
            req.stage = Stage.PREFILL
            self._queried(req)
            self.chan.send(p, Gen(rid=req.wire, prompt_ids=ids, params=params, kind="full", isolated=req.isolated,
                                  predicted=r.predicted or None, resumed=resumed))

    def _queried(self, req: LiveRequest) -> None:
        """Its prompt goes to a worker that looks it up in its prefix cache (a scored prompt is not)."""
        if self.cluster.prefix is not None and req.params.prompt_logprobs is None:
            self.metrics.prefix_queried(len(req.prompt_ids))
            self.cluster.prefix_sent(req.pr)   # what the router's view expects the worker's cache to give

    def _send_prefill(self, req: LiveRequest, blocks: list[int] | None = None, skip: int | None = None) -> None:
        """The prompt worker's `gen` (kind prefill): the KV to the token worker (`blocks`: one-sided; `skip`: held)."""
        r = req.pr
        t = self.workers[r.token_machine]
        req.stage = Stage.PREFILL
        self._queried(req)
        one_sided = t.kv_region is not None  # the prompt worker writes into these blocks
        ids, params, resumed = req.work()
        self.chan.send(self.workers[r.prompt_machine], Gen(
            rid=req.wire, prompt_ids=ids, params=params, kind="prefill", isolated=req.isolated,
            dest=t.id, dest_ident=t.ident.decode(), dest_addr=t.kv_addr, threshold=self.cfg.policy.layerwise_threshold,
            region=t.kv_region if one_sided else None, blocks=blocks if one_sided else None, skip=skip,
            resumed=resumed))

    def _dispatch_all(self, admitted: list[Request]) -> None:
        for r in admitted:
            req = self.reqs.by_policy.get(r.id)
            if req is not None and req.stage is Stage.WAITING:
                self._dispatch(req)

    # ---- the client's side -------------------------------------------------------------------
    def _deliver(self, req: LiveRequest, toks: list[int], lp: list | None = None) -> bool:
        """Send the client `toks`, those of them it does not have yet (a restarted try makes them
        again), with their logprob records where it asked (`lp`: [records of `toks`, the prompt's
        records or None], messages/kinds.py Out.lp)."""
        fresh = []
        for tok in toks:
            i = req.produced
            req.produced += 1
            if i < len(req.delivered):
                if req.delivered[i] != tok:
                    self._fail(req, "the request was restarted after a worker failure and the new "
                                    "try's tokens differ from those already sent (sampling "
                                    "without a seed); it cannot be resumed", 500)
                    return False
            else:
                fresh.append(tok)
        if fresh:
            now = time.perf_counter()
            if not req.delivered:
                req.first_at = now
                req.pr.first_token_at = now   # the policy view's token time: Aladdin's (d) reads it
                self.metrics.first_token(now - req.created, len(req.prompt_ids), len(fresh))
            else:
                self.metrics.tokens(now - req.last_at, len(fresh))
            req.last_at = now
            req.delivered.extend(fresh)
            recs = None
            if lp is not None:
                if req.prompt_logprobs is None:
                    req.prompt_logprobs = lp[1]
                recs = lp[0][len(lp[0]) - len(fresh):] if lp[0] is not None else None
            req.queue.put_nowait(("tokens", fresh, recs))
        return True

    def _complete(self, req: LiveRequest, reason: str) -> None:
        self.reqs.end(req)
        req.finish_reason = reason
        self.metrics.completed(req, reason, time.perf_counter())
        req.queue.put_nowait(("done", reason))

    def _release(self, req: LiveRequest) -> None:
        """Undo the current try everywhere: policy view and the workers holding it."""
        r = req.pr
        if r is None or req.wire not in self.reqs.by_wire:
            return
        admitted = self.cluster.release(r, req.prompt_ids + req.delivered[:req.produced])
        for wid in {r.prompt_machine, r.token_machine}:
            if 0 <= wid < len(self.workers) and self.workers[wid].up:
                # prefill_sent: the prompt worker may have written (one-sided) into the token worker's blocks
                self.chan.send(self.workers[wid], Abort(
                    rid=req.wire, prefill_sent=req.stage in (Stage.PREFILL, Stage.HANDOFF, Stage.DECODE)))
        self.reqs.untrack(req)
        self._dispatch_all(admitted)

    def _fail(self, req: LiveRequest, message: str, status: int, code: str | None = None) -> None:
        if req.stage is Stage.DONE:
            return
        self._release(req)
        self.reqs.end(req)
        self.metrics.requests.labels("failed").inc()
        req.queue.put_nowait(("error", message, status, code))

    def cancel(self, req: LiveRequest) -> None:
        """The client went away: stop the work."""
        if req.stage is Stage.DONE:
            return
        self._release(req)
        self.reqs.end(req)
        self.metrics.requests.labels("cancelled").inc()
