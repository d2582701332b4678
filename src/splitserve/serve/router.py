"""The router: admits requests, routes them with the cluster policy, talks to the workers.

It runs on the front end's event loop. `submit` admits a request (bounded: `Overloaded` past
`max_queue` requests in flight, `TooLarge` when no worker could ever hold it, `Unavailable` when
no worker can serve or the server is draining), asks `LiveCluster` (the simulator's policy code)
for its prompt and token workers, and sends the work:

    unsplit (mixed worker, baseline, or one output token):  gen(kind=full) -> worker
    split:  expect -> token worker (reserve KV blocks) ... reserved -> gen(kind=prefill, dest) ->
            prompt worker (--transport local: with the token worker's KV region, from its hello,
            and the reserved block ids, which the prompt worker writes into); its first token
            streams to the client at once; kv_in from the token worker when the KV landed; then
            decode tokens

Each try of a request has its own wire id (`<id>.<try>`), so anything a dead or aborted try
still says is ignored. Workers are started, watched and replaced by the Supervisor
(supervisor.py). When one dies, every request it touched is restarted on the others (from the
start; tokens the client already has are checked against the new ones and not sent twice), at
most `max_attempts` times per request. A request that finds no live worker waits up to
`park_timeout_s` for one. KV transfers that time out on the token worker restart their request.

Quarantine: a worker whose engine step raises survives it; it drops that step's requests and
reports them (`step_failed`). Each of them is restarted without penalty, isolated (its engine
runs it in steps of its own, so it cannot take others down with it again); a request that was in
a failed step twice is failed with an error that names it, and never retried.

Before judging a worker silent, the monitor reads every message already queued for the router,
and time during which the router's own loop stood still (a long callback, a stopped process) does
not count as a worker's silence.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from dataclasses import dataclass, field

import zmq

from ..policy.cluster import moves_kv
from ..policy.state import Pool, Request
from .cluster_state import LiveCluster, NoWorkers
from .config import ServeConfig
from .launcher import make_launcher
from .metrics import ServeMetrics
from .protocol import ROUTER_NAME, BadMessage, Codec, control_message_limit, limit_socket, new_secret
from .supervisor import Supervisor, WorkerInfo

POOLS = {"prompt": Pool.PROMPT, "token": Pool.TOKEN, "mixed": Pool.MIXED}
QUARANTINE_STRIKES = 2  # failed engine steps a request may be part of; the next retry is refused
PING_S = 1.0
MONITOR_S = 0.05
PAUSE_S = 0.5  # a monitor tick this late means the router itself stood still


class Overloaded(Exception):
    """Too many requests in flight: shed this one (HTTP 429)."""


class Unavailable(Exception):
    """No worker can serve now (HTTP 503)."""


class TooLarge(Exception):
    """No worker of this cluster could ever hold the request (HTTP 400)."""


@dataclass(eq=False)
class LiveRequest:
    id: int
    name: str                  # the id the client sees (cmpl-...): errors and logs name it
    prompt_ids: list[int]
    params: dict
    created: float
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    delivered: list[int] = field(default_factory=list)
    produced: int = 0          # tokens seen from the current try
    tries: int = 0             # tries so far; each has its own wire id <id>.<try>
    attempt: int = 0           # failed tries that count against max_attempts
    wire: str = ""
    pr: Request | None = None
    stage: str = "new"         # waiting | reserving | prefill | handoff | decode | done
    split: bool = False
    strikes: int = 0           # failed engine steps it was in
    isolated: bool = False     # run in engine steps of its own (it was in a failed step)
    first_at: float = 0.0
    last_at: float = 0.0
    parked_at: float = 0.0
    finish_reason: str | None = None


class Router:
    def __init__(self, cfg: ServeConfig, metrics: ServeMetrics | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics or ServeMetrics()
        self.secret = new_secret()
        self.codec = Codec(self.secret, ROUTER_NAME)
        self.sup: Supervisor | None = None
        self.workers = [WorkerInfo(i, home) for i, home in enumerate(cfg.homes())]
        self.active: dict[int, LiveRequest] = {}       # request id -> request, until it ends
        self.by_wire: dict[str, LiveRequest] = {}
        self.by_policy: dict[int, LiveRequest] = {}
        self.parked: list[LiveRequest] = []
        self.cluster: LiveCluster | None = None
        self._ids = itertools.count()
        self._pids = itertools.count()
        self._tasks: list[asyncio.Task] = []
        self.ctx: zmq.Context | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_scheduled = False
        self.sock = None
        self.address = ""
        self._max_request = 0
        self.strangers = 0  # messages from identities of no current worker (dropped unread)
        self.ready = False
        self.draining = False
        self.closing = False

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.cfg
        self.ctx = zmq.Context()
        self._loop = asyncio.get_running_loop()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # identities are unguessable (protocol.worker_identity), so nobody can hold one first
        self.codec.max_head = control_message_limit(self._max_model_len(), cfg.max_num_seqs)
        limit_socket(self.sock, self.codec.max_head, hwm=100_000)
        port = self.sock.bind_to_random_port(f"tcp://{cfg.worker_host}")
        self.address = f"tcp://{cfg.worker_host}:{port}"
        launcher = make_launcher(cfg.backend, self.secret, cfg.ray_address)
        self.sup = Supervisor(cfg, self.secret, launcher, self._argv, self._worker_down, self._launched)
        self.workers = self.sup.workers
        self._loop.add_reader(self.sock.getsockopt(zmq.FD), self._kick)
        now = time.monotonic()
        for w in self.workers:
            self.sup.launch(w, now)
        deadline = now + cfg.startup_timeout_s
        while not all(w.up for w in self.workers):  # at start, any failure is fatal (bad config)
            self._drain_all()
            for w in self.workers:
                if not w.up and not launcher.alive(w.handle):
                    raise RuntimeError(f"worker {w.id} exited during startup (see its error above)")
            if time.monotonic() > deadline:
                late = [w.id for w in self.workers if not w.up]
                raise RuntimeError(f"workers {late} did not start within {cfg.startup_timeout_s:g} s "
                                   f"(--worker-start-timeout)")
            await asyncio.sleep(0.05)
        homes = [POOLS[w.home] for w in self.workers]
        if not cfg.split:
            homes = [Pool.MIXED] * len(homes)
        caps = [self._kv_tokens(w) for w in self.workers]
        self.cluster = LiveCluster(homes, caps, cfg.split, cfg.policy.routing, kv_block=self.workers[0].block_size)
        self.max_request_tokens()
        self._tasks.append(asyncio.create_task(self._monitor_loop()))
        self.ready = True

    def _max_model_len(self) -> int:
        from pathlib import Path

        from ..engine.config import ModelConfig
        from ..engine.presets import get_preset

        p = Path(self.cfg.model)
        return (ModelConfig.from_dir(p) if p.is_dir() else get_preset(self.cfg.model)).max_position_embeddings

    @staticmethod
    def _kv_tokens(w: WorkerInfo) -> int:
        return w.blocks * w.block_size  # the policy reserves whole blocks (Machine.kv_block)

    def _argv(self, w: WorkerInfo) -> list[str]:
        cfg = self.cfg
        argv = ["--id", str(w.id), "--gen", str(w.gen), "--router", self.address, "--model", cfg.model,
                "--host", cfg.worker_host, "--device", cfg.device, "--dtype", cfg.dtype,
                "--seed", str(cfg.seed), "--max-num-seqs", str(cfg.max_num_seqs),
                "--threads", str(cfg.worker_threads), "--transport", cfg.transport,
                "--transfer-timeout-s", str(cfg.transfer_timeout_s), "--worker-mode", cfg.worker_mode,
                "--orphan-timeout-s", str(cfg.worker_orphan_timeout_s), "--policy", cfg.worker_policy().to_json()]
        if cfg.echo_token_delay_s:
            argv += ["--echo-token-delay-s", str(cfg.echo_token_delay_s)]
        if cfg.num_blocks:
            argv += ["--num-blocks", str(cfg.num_blocks)]
        if cfg.debug_layer_delay_s and w.home == "prompt":
            argv += ["--debug-layer-delay-s", str(cfg.debug_layer_delay_s)]
        if cfg.debug_fail_token is not None:
            argv += ["--debug-fail-token", str(cfg.debug_fail_token)]
        return argv

    def _launched(self, w: WorkerInfo) -> None:
        if w.restarts:
            self.metrics.worker_restarts.inc()

    def drain(self) -> None:
        """Shutdown begins: admit nothing new (503); what is in flight may finish."""
        self.draining = True

    def fail_all(self, why: str) -> None:
        """End every request in flight with an error (a stream's last event, then [DONE])."""
        for req in list(self.active.values()):
            self._fail(req, why, 503)

    async def stop(self) -> None:
        self.closing = True
        self.fail_all("the server is shutting down")
        for w in self.workers:
            if w.up:
                self._send(w, {"t": "stop"})
        await asyncio.sleep(0.05)
        for t in self._tasks:
            t.cancel()
        if self.sup is not None:
            self.sup.stop()
        if self.sock is not None:
            self._loop.remove_reader(self.sock.getsockopt(zmq.FD))
            self.sock.close(linger=0)
            self.sock = None
        if self.ctx is not None:
            self.ctx.destroy(linger=0)

    # ---- messaging -------------------------------------------------------------------------
    def _send(self, w: WorkerInfo, header: dict) -> None:
        if self.sock is None:
            return
        try:
            self.sock.send_multipart([w.ident, *self.codec.encode(header, to=w.ident.decode())], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # an unroutable (dead) worker: its requests are restarted by the monitor
        self._kick()

    # ZeroMQ's file descriptor is edge-triggered: it fires when the socket's state changes, and
    # any send or receive can consume that change. So the reader drains until EVENTS says empty,
    # and every send schedules another drain (`_kick`); the monitor drains too, as a safety net.
    def _kick(self) -> None:
        if not self._drain_scheduled and self._loop is not None:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self, limit: int = 2000) -> bool:
        """Handle up to `limit` queued messages (then let the HTTP side run); True if none are left."""
        self._drain_scheduled = False
        sock = self.sock
        if sock is None or sock.closed:
            return True
        for _ in range(limit):
            try:
                fr = sock.recv_multipart(flags=zmq.NOBLOCK)  # bytes: cheaper than Frames for small messages
            except zmq.Again:
                return True
            ident = fr[0]
            w = self.sup.by_ident.get(ident)
            if w is None:  # a stale generation, or a stranger (who cannot sign anyway)
                self.strangers += 1
                continue
            try:
                h, _ = self.codec.decode(fr[1:], sender=ident.decode())
                self._on_message(w, h)
            except BadMessage:
                continue
            except Exception as e:  # a bug must not kill the router
                print(f"router: error handling a message: {e!r}", file=sys.stderr)
        self._kick()
        return False

    def _drain_all(self) -> None:
        while not self._drain(limit=10_000):
            pass

    def _on_message(self, w: WorkerInfo, h: dict) -> None:
        t = h["t"]
        w.last_seen = time.monotonic()
        if t == "out":
            self._on_step_end(w, h["items"])
        elif t == "step":
            get = self.by_wire.get
            live = lambda rids: [req.pr for req in map(get, rids) if req is not None]  # noqa: E731
            chunks = [(req.pr, n) for req, n in ((get(rid), n) for rid, n in h["chunks"]) if req is not None]
            self.cluster.step_started(w.id, chunks, live(h["preempted"]), live(h["joined"]))
        elif t == "hb":
            w.free, w.blocks, w.reserved = h["free"], h["blocks"], h["reserved"]
            w.running, w.rejected, w.preempted = h["running"], h["rejected"], h["preempted"]
        elif t == "reserved":
            req = self.by_wire.get(h["rid"])
            if req is not None and req.stage == "reserving":
                if h["ok"]:
                    self._send_prefill(req, h.get("blocks"))
                else:
                    self._restart(req, f"token worker could not reserve KV: {h.get('msg')}")
        elif t == "kv_in":
            req = self.by_wire.get(h["rid"])
            mode = h["mode"]
            m = self.metrics
            m.transfers.labels(mode).inc()
            m.transfer_bytes.labels(mode).inc(h["bytes"])
            m.transfer_s.labels(mode).inc(h["seconds"])
            m.transfer_exposed.labels(mode).inc(h["exposed"])
            if req is not None and req.stage == "prefill":
                # the token worker may report before the router has the prompt worker's word
                self.cluster.first_from_token_worker(req.pr)
                req.stage = "handoff"
                self._deliver(req, [h["first"]])
            if req is not None and req.stage == "handoff":
                self._dispatch_all(self.cluster.kv_landed(req.pr))
                req.stage = "decode"
        elif t == "kv_fail":
            self.metrics.transfer_failures.inc()
            req = self.by_wire.get(h["rid"])
            if req is not None and req.stage in ("reserving", "prefill", "handoff"):
                self._restart(req, h["reason"])
        elif t == "step_failed":
            self._on_step_failed(w, h["rids"], h["error"])
        elif t == "err":
            req = self.by_wire.get(h["rid"])
            if req is not None:
                self._fail(req, f"worker {w.id} rejected the request: {h['msg']}", 400)
        elif t == "hello":
            self._on_hello(w, h)

    def _on_hello(self, w: WorkerInfo, h: dict) -> None:
        if not self.sup.hello(w, h["pid"], time.monotonic()):
            return  # not the process we started
        w.kv_addr, w.blocks, w.block_size = h["kv"], h["blocks"], h["block_size"]
        w.kv_region = h.get("region")
        w.free = w.start_free = h["free"]
        w.max_len = h["max_len"]
        if self.cluster is not None:
            self.cluster.up(w.id, self._kv_tokens(w))
            parked, self.parked = self.parked, []
            for req in parked:
                self._begin(req)

    def _on_step_failed(self, w: WorkerInfo, rids: list[str], error: str) -> None:
        """A step of w's engine raised; it dropped the step's requests and lives on."""
        print(f"router: worker {w.id}: an engine step failed ({error}); its requests: "
              f"{', '.join(self.by_wire[r].name for r in rids if r in self.by_wire) or 'none left'}",
              file=sys.stderr, flush=True)
        for rid in rids:
            req = self.by_wire.get(rid)
            if req is None:
                continue
            req.strikes += 1
            if req.strikes >= QUARANTINE_STRIKES:
                self.metrics.requests.labels("quarantined").inc()
                self._fail(req, f"request {req.name} was in {req.strikes} failed engine steps and is quarantined: "
                                f"it is not retried (last error: {error})", 500, "request_quarantined")
            else:
                req.isolated = True
                self._restart(req, f"worker {w.id}'s engine step failed: {error}", penalty=False)

    # ---- admission ---------------------------------------------------------------------------
    def max_request_tokens(self) -> int:
        """Tokens (prompt and output) one request may hold: what the smallest worker that may have
        to hold all of it can (its context and KV cache), as they said at start."""
        if not self._max_request:
            holders = [w for w in self.workers if w.home != "prompt" or not self.cfg.split]
            self._max_request = min(min(w.max_len, self._kv_tokens(w)) for w in holders)
        return self._max_request

    def submit(self, prompt_ids: list[int], params: dict, name: str = "") -> LiveRequest:
        if not self.ready or self.closing or self.draining:
            raise Unavailable("the server is starting or shutting down")
        if len(self.active) >= self.cfg.max_queue:
            raise Overloaded(f"{len(self.active)} requests in flight (limit {self.cfg.max_queue})")
        need = len(prompt_ids) + params["max_tokens"]
        if need > self._max_request:
            raise TooLarge(f"the request needs {need} tokens of KV cache (prompt {len(prompt_ids)} + "
                           f"max_tokens {params['max_tokens']}); a worker holds at most {self._max_request}")
        if not any(w.up for w in self.workers):
            raise Unavailable("no worker is up")
        req = LiveRequest(next(self._ids), name, list(prompt_ids), params, time.perf_counter())
        self.active[req.id] = req
        self._begin(req)
        return req

    def _begin(self, req: LiveRequest) -> None:
        """Route one attempt of `req` and send it on its way (or park it / queue it for memory)."""
        r = Request(next(self._pids), time.perf_counter(), len(req.prompt_ids), req.params["max_tokens"],
                    isolated=req.isolated)
        req.pr = r
        req.wire = f"{req.id}.{req.tries}"
        req.tries += 1
        req.produced = 0
        try:
            go = self.cluster.arrive(r)
        except NoWorkers as e:
            self._park(req, str(e))
            return
        self.by_wire[req.wire] = req
        self.by_policy[r.id] = req
        if go:
            self._dispatch(req)
        else:
            req.stage = "waiting"

    def _park(self, req: LiveRequest, why: str) -> None:
        if not req.parked_at:
            req.parked_at = time.monotonic()
        req.stage = "parked"
        if time.monotonic() - req.parked_at > self.cfg.park_timeout_s:
            self._fail(req, f"no worker could take the request: {why}", 503)
        else:
            self.parked.append(req)

    def _dispatch(self, req: LiveRequest) -> None:
        r = req.pr
        p, t = self.workers[r.prompt_machine], self.workers[r.token_machine]
        req.split = moves_kv(r)
        if req.split:
            req.stage = "reserving"
            self._send(t, {"t": "expect", "rid": req.wire, "ids": req.prompt_ids, "p": req.params, "src": p.id,
                           "iso": req.isolated})
        else:
            req.stage = "prefill"
            self._send(p, {"t": "gen", "rid": req.wire, "ids": req.prompt_ids, "p": req.params, "kind": "full",
                           "iso": req.isolated})

    def _send_prefill(self, req: LiveRequest, blocks: list[int] | None = None) -> None:
        r = req.pr
        t = self.workers[r.token_machine]
        req.stage = "prefill"
        msg = {"t": "gen", "rid": req.wire, "ids": req.prompt_ids, "p": req.params, "kind": "prefill",
               "dest": t.id, "dest_ident": t.ident.decode(), "addr": t.kv_addr, "thr": self.cfg.policy.layerwise_threshold,
               "iso": req.isolated}
        if t.kv_region is not None:  # one-sided transport: the prompt worker writes into these blocks
            msg.update(region=t.kv_region, blocks=blocks)
        self._send(self.workers[r.prompt_machine], msg)

    def _dispatch_all(self, admitted: list[Request]) -> None:
        for r in admitted:
            req = self.by_policy.get(r.id)
            if req is not None and req.stage == "waiting":
                self._dispatch(req)

    # ---- progress ----------------------------------------------------------------------------
    def _on_step_end(self, w: WorkerInfo, items: list) -> None:
        """A step of w's ended with these tokens: the view's transitions for the whole step first
        (as the simulator's iteration end), then each request's tokens go to its client."""
        mine = []
        for rid, toks, finished, reason in items:
            req = self.by_wire.get(rid)
            if req is None or (reason == "prefill" and req.stage != "prefill"):
                continue  # gone, or its first token came with its KV already (kv_in)
            mine.append((req, toks, finished, reason))
        admitted = self.cluster.end_step(w.id, [(req.pr, len(toks), finished) for req, toks, finished, _ in mine])
        for req, toks, finished, reason in mine:
            if reason == "prefill":
                req.stage = "handoff"
            elif req.stage == "prefill":
                if req.split and finished:  # it ended at its first token: the token worker's blocks go
                    self._send(self.workers[req.pr.token_machine], {"t": "cancel", "rid": req.wire})
                req.stage = "decode"
            if self._deliver(req, toks) and finished:
                self._complete(req, reason or "stop")
        self._dispatch_all(admitted)

    def _deliver(self, req: LiveRequest, toks: list[int]) -> bool:
        fresh = []
        for tok in toks:
            i = req.produced
            req.produced += 1
            if i < len(req.delivered):
                if req.delivered[i] != tok:
                    self._fail(req, "the request was restarted after a worker failure and the new "
                                    "attempt's tokens differ from those already sent (sampling "
                                    "without a seed); it cannot be resumed", 500)
                    return False
            else:
                fresh.append(tok)
        if fresh:
            now = time.perf_counter()
            if not req.delivered:
                req.first_at = now
                self.metrics.ttft.observe(now - req.created)
            else:
                self.metrics.observe_gap(now - req.last_at, len(fresh))
            req.last_at = now
            req.delivered.extend(fresh)
            req.queue.put_nowait(("tokens", fresh))
        return True

    def _end(self, req: LiveRequest) -> None:
        req.stage = "done"
        self.active.pop(req.id, None)
        self.by_wire.pop(req.wire, None)
        if req.pr is not None:
            self.by_policy.pop(req.pr.id, None)
        if req in self.parked:
            self.parked.remove(req)

    def _complete(self, req: LiveRequest, reason: str) -> None:
        self._end(req)
        req.finish_reason = reason
        self.metrics.e2e.observe(time.perf_counter() - req.created)
        self.metrics.requests.labels("completed").inc()
        req.queue.put_nowait(("done", reason))

    def _release(self, req: LiveRequest) -> None:
        """Undo the current attempt everywhere: policy state and the workers holding it."""
        r = req.pr
        if r is None or req.wire not in self.by_wire:
            return
        admitted = self.cluster.release(r)
        for wid in {r.prompt_machine, r.token_machine}:
            if 0 <= wid < len(self.workers) and self.workers[wid].up:
                # prefill_sent: the prompt worker may have written (one-sided) into the token worker's blocks
                self._send(self.workers[wid], {"t": "abort", "rid": req.wire,
                                               "prefill_sent": req.stage in ("prefill", "handoff", "decode")})
        self.by_wire.pop(req.wire, None)
        self.by_policy.pop(r.id, None)
        self._dispatch_all(admitted)

    def _fail(self, req: LiveRequest, message: str, status: int, code: str | None = None) -> None:
        if req.stage == "done":
            return
        self._release(req)
        self._end(req)
        self.metrics.requests.labels("failed").inc()
        req.queue.put_nowait(("error", message, status, code))

    def cancel(self, req: LiveRequest) -> None:
        """The client went away: stop the work."""
        if req.stage == "done":
            return
        self._release(req)
        self._end(req)
        self.metrics.requests.labels("cancelled").inc()

    def _restart(self, req: LiveRequest, why: str, penalty: bool = True) -> None:
        """Try `req` again from the start; `penalty`: this counts against its `max_attempts`."""
        if req.stage == "done":
            return
        self._release(req)
        if penalty:
            req.attempt += 1
            if req.attempt >= self.cfg.max_attempts:
                self._fail(req, f"the request failed {req.attempt} times; last: {why}", 503)
                return
        self.metrics.restarts.inc()
        self._begin(req)

    # ---- liveness ----------------------------------------------------------------------------
    async def _monitor_loop(self) -> None:
        next_ping = 0.0
        tick = time.monotonic()
        while True:
            await asyncio.sleep(MONITOR_S)
            self._drain_all()  # read what is queued before judging anyone silent
            now = time.monotonic()
            if now - tick > MONITOR_S + PAUSE_S:  # this loop stood still: a pause of ours is no one's silence
                self.sup.paused(now - tick - MONITOR_S)
            tick = now
            self.sup.check(now)
            if now >= next_ping:
                next_ping = now + PING_S
                for w in self.workers:
                    if w.up:
                        self._send(w, {"t": "ping"})
            if self.parked:
                parked, self.parked = self.parked, []
                for req in parked:
                    if req.stage == "parked":
                        self._begin(req)

    def _worker_down(self, w: WorkerInfo, why: str) -> None:
        """The supervisor took w out (dead or hung): restart what it held, tell its peers."""
        self.cluster.down(w.id)
        hit = [q for q in list(self.by_wire.values())
               if q.pr is not None and w.id in (q.pr.prompt_machine, q.pr.token_machine)]
        for req in hit:
            self._restart(req, f"worker {w.id} failed ({why})")
        for other in self.workers:
            if other.up:
                self._send(other, {"t": "peer_down", "peer": w.id})

    # ---- views -------------------------------------------------------------------------------
    def health(self) -> tuple[bool, dict]:
        if self.sup is None or not self.ready:
            return False, {"status": "starting"}
        ok, body = self.sup.health(self.cfg.split)
        if self.draining or self.closing:
            ok, body["status"], body["reason"] = False, "draining", "the server is shutting down"
        return ok, body

    def cluster_snapshot(self) -> list[dict]:
        return self.cluster.snapshot() if self.cluster is not None else []

    def debug_state(self) -> dict:
        return {
            "workers": [{"id": w.id, "home": w.home, "up": w.up, "state": w.state.value, "pid": w.pid,
                         "blocks": w.blocks, "free": w.free, "start_free": w.start_free, "reserved": w.reserved,
                         "running": w.running, "preempted": w.preempted, "rejected_messages": w.rejected,
                         "restarts": w.restarts, "failures": w.failures, "last_failure": w.last_failure,
                         "kv_addr": w.kv_addr} for w in self.workers],
            "machines": self.cluster_snapshot(),
            "policy_idle": self.cluster.idle() if self.cluster is not None else True,
            "in_flight": len(self.active),
            "parked": len(self.parked),
            "router_address": self.address,
            "rejected_messages": self.codec.rejected + self.strangers,
            "rejected_by": {**self.codec.rejected_by, "stranger": self.strangers},
        }
