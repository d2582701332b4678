"""A worker: one OS process owning one engine, in the prompt, token or mixed pool.

    python -m splitserve.serve.worker --id 0 --router tcp://127.0.0.1:5555 --model tiny
    (started by `splitserve serve`; the cluster secret comes in SPLITSERVE_CLUSTER_SECRET)

The pool is the router's business: any worker runs what it is sent. "gen" with kind "full" runs
a request here from prompt to last token (mixed / baseline); kind "prefill" runs the prompt only and
ships its KV to the token worker named in the message (see kv/); "expect" reserves blocks for KV
that is about to arrive, after which the request decodes here. Batching and preemption inside are
the simulator's machine-level policy, run by the engine's scheduler (policy/machine.py).

Loop: wait for messages (not at all while the engine has work), handle them, run one engine step,
send that step's tokens to the router in one message, expire late KV reservations, heartbeat.
Messages to the router wait in an outbox and go together, one ZeroMQ message of signed pairs,
before each engine step runs and at the end of the loop (docs/architecture.md, Messages). A
worker whose router is quiet for `--orphan-timeout` seconds exits. Once started, a worker freezes
its Python heap (heap.py). A step that raises (engine.StepFailed) costs its requests, not the
worker: it reports them (`step_failed`; the router restarts them isolated or quarantines them);
after MAX_STEP_FAILURES failed steps in a row the worker exits (the router replaces it).

Its identity on the router's socket is derived from the cluster secret, its id and its generation
(protocol.worker_identity): never on a command line. Its sockets refuse messages larger than the
model's prompts and KV need (protocol.limit_socket). With `--kv-encryption on` its control and KV
sockets are encrypted with CURVE, keys derived from the cluster secret (curve.py)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, cast

import zmq

from ..engine.contract import Engine, StepFailed
from ..errors import UserError
from ..heap import freeze_heap
from ..logs import configure as configure_logging
from .curve import CurveKeys, encryption_on
from .kv import BothSides, KVReceiver, KVSender, make_transport
from .messages import (Abort, Cancel, Err, Expect, Gen, Heartbeat, Hello, KvFail, KvIn, Message, Out, OutItem,
                       PeerDown, Ping, Reserved, Step, StepChunk, Stop)
from .messages import StepFailed as StepFailedMsg
from .protocol import Codec, boot_id, control_message_limit, secret_from_env, worker_identity
from .worker_args import parse_args
from .worker_engine import build_engine, item_logprobs, sampling_params
from .worker_link import RouterLink

if TYPE_CHECKING:
    import torch

HEARTBEAT_S, MAX_STEP_FAILURES = 0.2, 3
IDLE_WAIT_MS = 50  # an idle worker wakes at once for a message; this only paces heartbeats and deadlines
logger = logging.getLogger(__name__)


class Worker:
    def __init__(self, args, engine: Engine, codec: Codec, region=None, curve: CurveKeys | None = None) -> None:
        self.args, self.engine, self.codec = args, engine, codec
        self.ctx: zmq.Context = zmq.Context.instance()
        control = codec.max_head = control_message_limit(engine.max_model_len, args.max_num_seqs)
        self.link = RouterLink(self.ctx, codec, args.router, control, args.id, curve)
        self.send = self.link.send  # sign into the outbox; self.link.post() sends it
        # KV messages: a whole request's KV in one frame at most
        kv_limit = control + engine.max_model_len * engine.kv_host.kv_layout.bytes_per_token
        self.transport = make_transport(args.transport, self.ctx, codec, args.host, region, max_message=kv_limit,
                                        slot_ids=engine.kv_host.kv_slot_ids, curve=curve,
                                        # nccl: its pairs' device (engine/contract.py types it `object`,
                                        # keeping torch out of the contract)
                                        device=cast("torch.device | None", engine.device),
                                        timeout_s=max(30.0, 6 * args.transfer_timeout_s))
        self.sender = KVSender(self.transport, args.debug_layer_delay_s)
        self.receiver = KVReceiver(args.transfer_timeout_s, one_sided=self.transport.one_sided,
                                   notify=self.on_kv_event)
        engine.connector = BothSides(self.sender, self.receiver)  # the engine drives both (engine/kv_connector.py)
        self.kinds: dict[str, str] = {}  # rid -> "full" | "prefill" | "decode"
        self.items: list[OutItem] = []  # tokens for the router, into the outbox once per loop
        self.item_tokens = 0  # and their count
        self.lps: dict[str, list] = {}  # logprob records, rid -> (Out.lp)
        self.running = True
        self.echo = args.worker_mode == "echo"
        self.step_failures = 0  # in a row
        self.stepped = False    # a step report went out: its "out" must follow, even empty
        self.formed = False     # the engine formed a batch in this loop (report_step ran)
        engine.on_schedule = self.report_step
        # --step-log: a JSON line per engine step run (start, seconds, shape), for `splitserve twin`
        self.step_log = open(args.step_log, "a", buffering=1) if args.step_log else None

    def hello(self) -> None:
        e = self.engine
        self.send(Hello(worker_id=self.args.id, pid=os.getpid(), kv_addr=self.transport.address,
                        blocks=e.blocks.num_blocks, block_size=e.blocks.block_size, free=e.blocks.num_free,
                        max_len=e.max_model_len, region=self.transport.region, boot=boot_id()))
        self.link.post()

    def heartbeat(self) -> None:
        e = self.engine
        e.check_alive()  # a dead tensor-parallel rank ends this worker, busy or idle: it is replaced
        self.send(Heartbeat(worker_id=self.args.id, free=e.blocks.num_free, blocks=e.blocks.num_blocks,
                            reserved=e.kv_host.num_reserved, running=len(self.kinds),
                            rejected=self.codec.rejected + self.link.malformed + sum(self.receiver.malformed.values()),
                            stray=self.receiver.stray,
                            preempted=e.num_preemptions))

    # ---- messages from the router ----------------------------------------------------------
    def on_ctl(self, msg: Message) -> None:
        match msg:
            case Gen(rid=rid, kind=kind):
                try:
                    self.engine.add_request(msg.prompt_ids, sampling_params(msg.params, self.echo), rid,
                                            prefill_only=kind == "prefill", isolated=msg.isolated,
                                            predicted=msg.predicted or 0, resumed=msg.resumed or 0)
                except UserError as e:
                    self.send(Err(rid=rid, msg=str(e)))
                    return
                self.kinds[rid] = kind
                if kind == "prefill":
                    # decode checked that a prefill names where its KV goes (messages/codec.py _check_gen)
                    assert (msg.dest is not None and msg.dest_ident is not None and msg.dest_addr is not None
                            and msg.threshold is not None)
                    self.sender.plan(rid, msg.dest, msg.dest_ident, msg.dest_addr, msg.threshold,
                                     where={"region": msg.region, "blocks": msg.blocks}, skip=msg.skip or 0)
            case Expect(rid=rid):
                try:
                    where = self.receiver.expect(rid, msg.prompt_ids, sampling_params(msg.params, self.echo),
                                                 msg.src, isolated=msg.isolated, resumed=msg.resumed or 0)
                except UserError as e:  # NoRoom (engine/scheduler.py): the router's view lagged; it waits
                    self.send(Reserved(rid=rid, ok=False, msg=str(e), full=type(e).__name__ == "NoRoom" or None))
                    return
                # `where`: one-sided, the blocks the prompt worker writes into
                self.send(Reserved(rid=rid, ok=True, blocks=where.get("blocks"), skip=where.get("skip") or None))
            case Abort(rid=rid, prefill_sent=sent):
                self.drop(rid, sent)
            case Cancel(rid=rid):
                self.drop(rid)
            case PeerDown(peer=peer):
                self.transport.drop_peer(peer)
                self.receiver.peer_down(peer)
            case Stop():
                self.running = False
            case Ping():
                pass  # the router is alive (the link notes when it last heard of it, any message)

    def drop(self, rid: str, prefill_sent: bool = True) -> None:
        """Forget `rid` everywhere in this worker (idempotent)."""
        self.engine.abort(rid)  # its connector hears of it (a prefill's plan goes)
        self.receiver.release(rid, prefill_sent)
        self.kinds.pop(rid, None)

    def report_step(self, rep) -> None:
        """The engine formed a step and is about to run it: tell the router what the policy
        decided (its view of this worker follows the same transitions; the step's `out` closes
        it), and send the outbox, where the previous step's `out` may still wait (run())."""
        self.formed = True
        for rid in rep.left:   # preempted to recompute through the prompt pool: the router sends it on
            self.kinds.pop(rid, None)
        if rep.told():
            self.send(step_message(rep, time.perf_counter()))
            self.stepped = True
        self.link.post()

    def step(self) -> None:
        """One engine step; a step that raises costs its requests, not the worker."""
        start, t0, c0 = time.time(), time.perf_counter(), time.process_time()
        try:
            outs = self.engine.step()
        except StepFailed as e:
            for rid in e.request_ids:
                self.drop(rid)
            self.send(StepFailedMsg(rids=list(e.request_ids), error=repr(e.cause)[:500]))
            logger.error("worker %d: engine step failed: %r", self.args.id, e.cause)
            self.step_failures += 1
            if self.step_failures >= MAX_STEP_FAILURES:
                raise RuntimeError(f"{self.step_failures} engine steps in a row failed; exiting") from e.cause
            return
        self.step_failures = 0
        shape = self.engine.last_shape
        if self.step_log is not None and shape:
            line = {"t": start, "s": time.perf_counter() - t0, "cpu": time.process_time() - c0, "seqs": shape}
            sent = [len(o.prompt_token_ids) for o in outs if o.finish_reason == "prefill"]
            if sent:  # prompts whose KV this step handed over (sent inside the step)
                line["sent"] = sent
            self.step_log.write(json.dumps(line) + "\n")
        self.on_outputs(outs)

    def on_kv(self, h: dict, data: list) -> None:
        self.receiver.handle(h, data)

    def on_kv_event(self, ev: KvIn | KvFail) -> None:
        """The receiver's `kv_in` / `kv_fail` for the router (kv_in: the request decodes here now)."""
        if type(ev) is KvIn:
            self.kinds[ev.rid] = "decode"
        self.send(ev)

    # ---- engine outputs ---------------------------------------------------------------------
    def on_outputs(self, outs) -> None:
        for o in outs:
            rid = o.request_id
            kind = self.kinds.get(rid)
            if kind is None:
                continue  # aborted meanwhile
            if (lp := item_logprobs(o)) is not None:
                self.lps[rid] = lp
            if o.finish_reason == "prefill":  # the engine closed its transfer (connector.request_finished)
                del self.kinds[rid]
                self.items.append(OutItem(rid, o.new_token_ids, False, "prefill"))
                continue
            if o.finished:
                del self.kinds[rid]
            self.items.append(OutItem(rid, o.new_token_ids, o.finished, o.finish_reason))
            self.item_tokens += len(o.new_token_ids)
            if self.item_tokens > self.engine.max_model_len:  # keep `out` within the router's message limit
                self.flush()

    def flush(self) -> None:
        if self.items or self.stepped:
            self.send(Out(items=self.items, lp=self.lps or None))
            self.items, self.item_tokens, self.stepped, self.lps = [], 0, False, {}

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.link.sock, zmq.POLLIN)
        poller.register(self.transport.inbound, zmq.POLLIN)
        self.hello()
        next_hb = time.monotonic() + HEARTBEAT_S
        while self.running:
            busy = self.engine.has_unfinished()
            ready = dict(poller.poll(0 if busy else IDLE_WAIT_MS))
            if self.link.sock in ready:
                for msg in self.link.receive():
                    self.on_ctl(msg)
            if self.transport.inbound in ready:
                for h, data in self.transport.recv_all():
                    self.on_kv(h, data)
            self.receiver.expire()  # kv_fail events go out through on_kv_event
            self.formed = False
            if self.engine.has_unfinished():
                self.step()
            self.flush()
            now = time.monotonic()
            if now >= next_hb:
                self.heartbeat()
                next_hb = now + HEARTBEAT_S
            if not (self.formed and self.engine.has_unfinished()):
                self.link.post()  # else the next step's report, in a moment, takes it along
                # after one long step the router's pings are queued, not missing: read them first
                if now - self.link.last_heard > self.args.orphan_timeout_s and not self.link.sock.poll(0):
                    logger.warning("worker %d: no word from the router for %g s; exiting", self.args.id,
                                   self.args.orphan_timeout_s)
                    break
        self.link.post()
        self.transport.close()
        self.link.close()


def step_message(rep, at: float | None = None) -> Step:
    """The `step` message of an engine's step report (policy/machine.py BatchReport), formed at
    `at` (time.perf_counter()), with its scheduler's own report (`sched`, None: left out)."""
    return Step(chunks=[StepChunk(*c) for c in rep.chunks], preempted=list(rep.preempted), joined=list(rep.joined),
                at=at, sched=rep.sched, cached=[StepChunk(*c) for c in rep.cached] or None,
                grown=list(rep.grown) or None)


def unlink_on_sigterm(region) -> None:
    """SIGTERM unlinks the shared KV segment, then does what it did before (terminate, or the
    host's handler)."""
    try:
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum, frame):
            region.close()
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_term)
    except ValueError:
        pass  # not the main thread (a Ray actor): the resource tracker unlinks it (shm.py)


def main(argv=None) -> int:
    configure_logging()  # the level serve was given (SPLITSERVE_LOG_LEVEL, logs.py)
    args = parse_args(argv, __doc__.splitlines()[0])
    secret = secret_from_env()
    codec = Codec(secret, worker_identity(secret, args.id, args.gen).decode())
    region = None
    if args.transport == "local" and args.worker_mode == "engine":
        from .shm import SharedKVRegion
        region = SharedKVRegion()  # the KV cache, in memory same-host peers can map
        unlink_on_sigterm(region)
    try:
        try:
            curve = CurveKeys.from_secret(secret) if encryption_on(args.kv_encryption, args.host) else None
            worker = Worker(args, build_engine(args, kv_alloc=region), codec, region, curve)
        except UserError as e:
            logger.error("worker %d: error: %s", args.id, e)
            return 2
        freeze_heap()  # startup's objects out of the collector's full passes
        if prefix := os.environ.get("SPLITSERVE_WORKER_PROFILE"):  # cProfile of the loop to PREFIX.<id>.prof
            import cProfile
            cProfile.runctx("worker.run()", globals(), {"worker": worker}, f"{prefix}.{args.id}.prof")
        else:
            worker.run()
        return 0
    finally:
        if region is not None:
            region.close()


if __name__ == "__main__":
    sys.exit(main())
