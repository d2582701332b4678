"""The router: admits requests, routes them with the cluster policy, talks to the workers.

It runs on the front end's event loop. `submit` admits a request (bounded: `Overloaded` past
`max_queue` requests in flight, `Unavailable` when no worker can serve), asks `LiveCluster` (the
simulator's policy code) for its prompt and token workers, and sends the work:

    unsplit (mixed worker, baseline, or one output token):  gen(kind=full) -> worker
    split:  expect -> token worker (reserve KV blocks) ... reserved -> gen(kind=prefill, dest) ->
            prompt worker (--transport local: with the token worker's KV region, from its hello,
            and the reserved block ids, which the prompt worker writes into); its first token
            streams to the client at once; kv_in from the token worker when the KV landed; then
            decode tokens

Each attempt at a request has its own wire id (`<id>.<attempt>`), so anything a dead or aborted
attempt still says is ignored. Worker liveness: a local worker's process exit is seen within
50 ms, any worker silent for `heartbeat_timeout_s` is killed; either way it is marked down, taken
out of its pool, its peers drop their links to it, every request it touched is restarted on the
others (from the start; tokens the client already has are checked against the new ones and not
sent twice), and a replacement is started. A request that finds no live worker waits up to
`park_timeout_s` for one. KV transfers that time out on the token worker restart their request.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from dataclasses import dataclass, field

import zmq

from ..policy.cluster import RoutingConfig
from ..policy.state import Pool, Request
from .cluster_state import LiveCluster, NoWorkers
from .config import ServeConfig
from .launcher import make_launcher
from .metrics import ServeMetrics
from .protocol import BadMessage, Codec, new_secret

POOLS = {"prompt": Pool.PROMPT, "token": Pool.TOKEN, "mixed": Pool.MIXED}


class Overloaded(Exception):
    """Too many requests in flight: shed this one (HTTP 429)."""


class Unavailable(Exception):
    """No worker can serve now (HTTP 503)."""


@dataclass(eq=False)
class WorkerInfo:
    id: int
    home: str
    handle: object = None
    up: bool = False
    kv_addr: str = ""
    kv_region: dict | None = None  # --transport local: its KV cache as a same-host peer maps it
    pid: int | None = None
    blocks: int = 0
    block_size: int = 16
    free: int = 0
    start_free: int = 0
    reserved: int = 0
    running: int = 0
    rejected: int = 0
    preempted: int = 0         # decodes its engine preempted (machine-level policy), this process
    max_len: int = 0
    last_seen: float = 0.0
    restarts: int = 0
    gen: int = 0
    hello: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class LiveRequest:
    id: int
    prompt_ids: list[int]
    params: dict
    created: float
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    delivered: list[int] = field(default_factory=list)
    produced: int = 0          # tokens seen from the current attempt
    attempt: int = 0
    wire: str = ""
    pr: Request | None = None
    stage: str = "new"         # waiting | reserving | prefill | handoff | decode | done
    split: bool = False
    first_at: float = 0.0
    last_at: float = 0.0
    parked_at: float = 0.0
    finish_reason: str | None = None


class Router:
    def __init__(self, cfg: ServeConfig, metrics: ServeMetrics | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics or ServeMetrics()
        self.secret = new_secret()
        self.codec = Codec(self.secret)
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
        self.launcher = None
        self.ready = False
        self.closing = False

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.cfg
        self.ctx = zmq.Context()
        self._loop = asyncio.get_running_loop()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # no ROUTER_HANDOVER: a second peer presenting a live worker's identity is refused; a
        # replacement worker gets a new identity (w<id>.<generation>)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        port = self.sock.bind_to_random_port(f"tcp://{cfg.worker_host}")
        self.address = f"tcp://{cfg.worker_host}:{port}"
        self.launcher = make_launcher(cfg.backend, self.secret, cfg.ray_address)
        self._loop.add_reader(self.sock.getsockopt(zmq.FD), self._kick)
        for w in self.workers:
            self._launch(w)
        deadline = time.monotonic() + cfg.startup_timeout_s
        for w in self.workers:
            while not w.hello.is_set():
                if not self.launcher.alive(w.handle):
                    raise RuntimeError(f"worker {w.id} exited during startup (see its error above)")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"worker {w.id} did not start within {cfg.startup_timeout_s:g} s")
                try:
                    await asyncio.wait_for(w.hello.wait(), 0.2)
                except asyncio.TimeoutError:
                    pass
        homes = [POOLS[w.home] for w in self.workers]
        if not cfg.split:
            homes = [Pool.MIXED] * len(homes)
        caps = [self._kv_tokens(w) for w in self.workers]
        self.cluster = LiveCluster(homes, caps, cfg.split, RoutingConfig(), kv_block=self.workers[0].block_size)
        self._tasks.append(asyncio.create_task(self._monitor_loop()))
        self.ready = True

    @staticmethod
    def _kv_tokens(w: WorkerInfo) -> int:
        return w.blocks * w.block_size  # the policy reserves whole blocks (Machine.kv_block)

    def _launch(self, w: WorkerInfo) -> None:
        cfg = self.cfg
        w.gen += 1
        argv = ["--id", str(w.id), "--ident", f"w{w.id}.{w.gen}", "--router", self.address, "--model", cfg.model,
                "--host", cfg.worker_host, "--device", cfg.device, "--dtype", cfg.dtype,
                "--seed", str(cfg.seed), "--max-num-seqs", str(cfg.max_num_seqs),
                "--threads", str(cfg.worker_threads), "--transport", cfg.transport,
                "--transfer-timeout-s", str(cfg.transfer_timeout_s), "--worker-mode", cfg.worker_mode,
                "--orphan-timeout-s", str(cfg.orphan_timeout_s), "--prompt-token-cap", str(cfg.prompt_cap),
                "--chunk-size", str(cfg.chunk_size), "--preemption-limit", str(cfg.preemption_limit)]
        if cfg.echo_token_delay_s:
            argv += ["--echo-token-delay-s", str(cfg.echo_token_delay_s)]
        if cfg.num_blocks:
            argv += ["--num-blocks", str(cfg.num_blocks)]
        if cfg.debug_layer_delay_s and w.home == "prompt":
            argv += ["--debug-layer-delay-s", str(cfg.debug_layer_delay_s)]
        w.hello = asyncio.Event()
        w.handle = self.launcher.start(w.id, argv)
        w.pid = self.launcher.pid(w.handle)
        w.last_seen = time.monotonic()

    async def stop(self) -> None:
        self.closing = True
        for req in list(self.active.values()):
            self._fail(req, "the server is shutting down", 503)
        for w in self.workers:
            if w.handle is not None and self.launcher.alive(w.handle):
                self._send(w.id, {"t": "stop"})
        await asyncio.sleep(0.05)
        for t in self._tasks:
            t.cancel()
        for w in self.workers:
            if w.handle is not None:
                self.launcher.kill(w.handle)
        if self.sock is not None:
            self._loop.remove_reader(self.sock.getsockopt(zmq.FD))
            self.sock.close(linger=0)
            self.sock = None
        if self.ctx is not None:
            self.ctx.destroy(linger=0)

    # ---- messaging -------------------------------------------------------------------------
    def _send(self, wid: int, header: dict) -> None:
        if self.sock is None:
            return
        try:
            w = self.workers[wid]
            self.sock.send_multipart([f"w{wid}.{w.gen}".encode(), *self.codec.encode(header)], flags=zmq.NOBLOCK)
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

    def _drain(self) -> None:
        self._drain_scheduled = False
        sock = self.sock
        if sock is None or sock.closed:
            return
        for _ in range(2000):  # then let the HTTP side run; the rest comes next turn
            try:
                fr = sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                h, _ = self.codec.decode(fr[1:])
                wid, _, gen = bytes(fr[0])[1:].decode().partition(".")
                w = self.workers[int(wid)]
                if int(gen) == w.gen:  # not a stale incarnation
                    self._on_message(w, h)
            except (BadMessage, ValueError, IndexError):
                continue
            except Exception as e:  # a bug must not kill the router
                print(f"router: error handling a message: {e!r}", file=sys.stderr)
        self._kick()

    def _on_message(self, w: WorkerInfo, h: dict) -> None:
        t = h["t"]
        w.last_seen = time.monotonic()
        if t == "out":
            for rid, toks, finished, reason in h["items"]:
                req = self.by_wire.get(rid)
                if req is not None:
                    self._on_tokens(req, w.id, toks, finished, reason)
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
                self._on_tokens(req, req.pr.prompt_machine, [h["first"]], False, "prefill")
            if req is not None and req.stage == "handoff":
                self.cluster.kv_arrived(req.pr)
                req.stage = "decode"
        elif t == "kv_fail":
            self.metrics.transfer_failures.inc()
            req = self.by_wire.get(h["rid"])
            if req is not None and req.stage in ("reserving", "prefill", "handoff"):
                self._restart(req, h["reason"])
        elif t == "err":
            req = self.by_wire.get(h["rid"])
            if req is not None:
                self._fail(req, f"worker {w.id} rejected the request: {h['msg']}", 400)
        elif t == "hello":
            self._on_hello(w, h)

    def _on_hello(self, w: WorkerInfo, h: dict) -> None:
        if w.pid is not None and h["pid"] != w.pid:
            return  # a stale process
        w.kv_addr, w.blocks, w.block_size = h["kv"], h["blocks"], h["block_size"]
        w.kv_region = h.get("region")
        w.free = w.start_free = h["free"]
        w.max_len = h["max_len"]
        w.up = True
        w.hello.set()
        if self.cluster is not None:
            self.cluster.up(w.id, self._kv_tokens(w))
            parked, self.parked = self.parked, []
            for req in parked:
                self._begin(req)

    # ---- admission ---------------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], params: dict) -> LiveRequest:
        if not self.ready or self.closing:
            raise Unavailable("the server is starting or stopping")
        if len(self.active) >= self.cfg.max_queue:
            raise Overloaded(f"{len(self.active)} requests in flight (limit {self.cfg.max_queue})")
        if not any(w.up for w in self.workers):
            raise Unavailable("no worker is up")
        req = LiveRequest(next(self._ids), list(prompt_ids), params, time.perf_counter())
        self.active[req.id] = req
        self._begin(req)
        return req

    def _begin(self, req: LiveRequest) -> None:
        """Route one attempt of `req` and send it on its way (or park it / queue it for memory)."""
        r = Request(next(self._pids), time.perf_counter(), len(req.prompt_ids), req.params["max_tokens"])
        req.pr = r
        req.wire = f"{req.id}.{req.attempt}"
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
        p, t = r.prompt_machine, r.token_machine
        req.split = p != t and r.output_tokens > 1
        if req.split:
            req.stage = "reserving"
            self._send(t, {"t": "expect", "rid": req.wire, "ids": req.prompt_ids, "p": req.params, "src": p})
        else:
            req.stage = "prefill"
            self._send(p, {"t": "gen", "rid": req.wire, "ids": req.prompt_ids, "p": req.params, "kind": "full"})

    def _send_prefill(self, req: LiveRequest, blocks: list[int] | None = None) -> None:
        r = req.pr
        t = self.workers[r.token_machine]
        req.stage = "prefill"
        msg = {"t": "gen", "rid": req.wire, "ids": req.prompt_ids, "p": req.params, "kind": "prefill",
               "dest": t.id, "addr": t.kv_addr, "thr": self.cfg.layerwise_threshold}
        if t.kv_region is not None:  # one-sided transport: the prompt worker writes into these blocks
            msg.update(region=t.kv_region, blocks=blocks)
        self._send(r.prompt_machine, msg)

    def _dispatch_all(self, admitted: list[Request]) -> None:
        for r in admitted:
            req = self.by_policy.get(r.id)
            if req is not None and req.stage == "waiting":
                self._dispatch(req)

    # ---- progress ----------------------------------------------------------------------------
    def _on_tokens(self, req: LiveRequest, wid: int, toks: list[int], finished: bool, reason: str | None) -> None:
        c = self.cluster
        r = req.pr
        if reason == "prefill" and req.stage != "prefill":
            return  # the token worker's kv_in already brought this first token
        if req.stage == "prefill":
            if reason == "prefill":
                self._dispatch_all(c.first_token(r, finished=False))
                req.stage = "handoff"
            else:
                early = finished and len(toks) == 1
                self._dispatch_all(c.first_token(r, finished=early))
                if req.split and early:
                    self._send(r.token_machine, {"t": "cancel", "rid": req.wire})
                if not early:
                    req.stage = "decode"
                    if len(toks) > 1:
                        c.tokens(r, len(toks) - 1)
                    if finished:
                        self._dispatch_all(c.finish(r))
        elif req.stage == "decode":
            c.tokens(r, len(toks))
            if finished:
                self._dispatch_all(c.finish(r))
        else:
            return
        if not self._deliver(req, toks):
            return
        if finished:
            self._complete(req, reason or "stop")

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
        admitted = self.cluster.forget(r)
        for wid in {r.prompt_machine, r.token_machine}:
            if 0 <= wid < len(self.workers) and self.workers[wid].up:
                # prefill_sent: the prompt worker may have written (one-sided) into the token worker's blocks
                self._send(wid, {"t": "abort", "rid": req.wire,
                                 "prefill_sent": req.stage in ("prefill", "handoff", "decode")})
        self.by_wire.pop(req.wire, None)
        self.by_policy.pop(r.id, None)
        self._dispatch_all(admitted)

    def _fail(self, req: LiveRequest, message: str, status: int) -> None:
        if req.stage == "done":
            return
        self._release(req)
        self._end(req)
        self.metrics.requests.labels("failed").inc()
        req.queue.put_nowait(("error", message, status))

    def cancel(self, req: LiveRequest) -> None:
        """The client went away: stop the work."""
        if req.stage == "done":
            return
        self._release(req)
        self._end(req)
        self.metrics.requests.labels("cancelled").inc()

    def _restart(self, req: LiveRequest, why: str) -> None:
        if req.stage == "done":
            return
        self._release(req)
        req.attempt += 1
        if req.attempt >= self.cfg.max_attempts:
            self._fail(req, f"the request failed {req.attempt} times; last: {why}", 503)
            return
        self.metrics.restarts.inc()
        self._begin(req)

    # ---- liveness ----------------------------------------------------------------------------
    async def _monitor_loop(self) -> None:
        next_ping = 0.0
        while True:
            await asyncio.sleep(0.05)
            self._kick()
            now = time.monotonic()
            for w in self.workers:
                if not w.up:
                    continue
                if not self.launcher.alive(w.handle):
                    self._worker_down(w, "its process exited")
                elif now - w.last_seen > self.cfg.heartbeat_timeout_s:
                    self._worker_down(w, f"silent for {self.cfg.heartbeat_timeout_s:g} s")
            if now >= next_ping:
                next_ping = now + 1.0
                for w in self.workers:
                    if w.up:
                        self._send(w.id, {"t": "ping"})
            if self.parked:
                parked, self.parked = self.parked, []
                for req in parked:
                    if req.stage == "parked":
                        self._begin(req)

    def _worker_down(self, w: WorkerInfo, why: str) -> None:
        print(f"router: worker {w.id} ({w.home}) is down: {why}", file=sys.stderr)
        w.up = False
        self.launcher.kill(w.handle)
        self.cluster.down(w.id)
        hit = [q for q in list(self.by_wire.values())
               if q.pr is not None and w.id in (q.pr.prompt_machine, q.pr.token_machine)]
        for req in hit:
            self._restart(req, f"worker {w.id} failed ({why})")
        for other in self.workers:
            if other.up:
                self._send(other.id, {"t": "peer_down", "peer": w.id})
        if self.cfg.restart_workers and w.restarts < self.cfg.max_worker_restarts and not self.closing:
            w.restarts += 1
            self.metrics.worker_restarts.inc()
            self._launch(w)

    # ---- views -------------------------------------------------------------------------------
    def cluster_snapshot(self) -> list[dict]:
        return self.cluster.snapshot() if self.cluster is not None else []

    def debug_state(self) -> dict:
        return {
            "workers": [{"id": w.id, "home": w.home, "up": w.up, "pid": w.pid, "blocks": w.blocks,
                         "free": w.free, "start_free": w.start_free, "reserved": w.reserved,
                         "running": w.running, "preempted": w.preempted, "rejected_messages": w.rejected,
                         "restarts": w.restarts, "kv_addr": w.kv_addr} for w in self.workers],
            "machines": self.cluster_snapshot(),
            "policy_idle": self.cluster.idle() if self.cluster is not None else True,
            "in_flight": len(self.active),
            "parked": len(self.parked),
            "router_address": self.address,
            "rejected_messages": self.codec.rejected,
        }
