"""A worker process's loop, in-process, against a bare ROUTER socket standing in for the router:
it speaks typed messages both ways (messages/), runs the engine token-for-token as the engine
alone does, answers a reservation it cannot make with reserved(ok=False), and drops a signed but
malformed message, counting it in its heartbeat, without losing the next one; a busy worker sends
one ZeroMQ message per step (the previous step's `out` goes with the next `step`)."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import zmq

from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.policy.config import BatchingConfig, PolicyConfig
from splitserve.serve.messages import (TO_ROUTER, Expect, Gen, Heartbeat, Hello, Out, Reserved, Step, StepChunk, Stop,
                                       WireParams, decode, encode)
from splitserve.serve.protocol import ROUTER_NAME, Codec, worker_identity
from splitserve.serve import worker as worker_module
from splitserve.serve.worker import Worker
from splitserve.serve.worker_args import parse_args
from splitserve.serve.worker_engine import build_engine, sampling_params

SECRET = b"0123456789abcdef0123456789abcdef"
GREEDY = WireParams(max_tokens=6, temperature=0.0, top_p=1.0, top_k=0, ignore_eos=True, stop_token_ids=[])


class FakeRouter:
    def __init__(self, ctx: zmq.Context) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.codec = Codec(SECRET, ROUTER_NAME)
        self.ident = worker_identity(SECRET, 0, 1)
        self.sends: list[int] = []  # per ZeroMQ message received: how many messages came before it

    def send_header(self, header: dict) -> None:
        self.sock.send_multipart([self.ident, *self.codec.encode(header, to=self.ident.decode())])

    def recv(self, until, timeout_s: float = 20.0) -> list:
        """Messages from the worker until `until(messages so far)` holds; `self.sends` counts
        the ZeroMQ messages they came in (a worker sends its outbox as (mac, head) pairs)."""
        got, deadline = [], time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.sock.poll(100):
                continue
            fr = self.sock.recv_multipart()
            self.sends.append(len(got))
            for i in range(1, len(fr), 2):
                h, _ = self.codec.decode(fr[i:i + 2], sender=fr[0].decode())
                got.append(decode(h, TO_ROUTER))
            if until(got):
                return got
        raise AssertionError(f"timed out; got {[type(m).__name__ for m in got]}")


def finished(m) -> bool:
    return isinstance(m, Out) and any(i.finished for i in m.items)


@pytest.fixture
def worker(request, monkeypatch):
    """(router, worker); parametrized indirectly with extra worker arguments, and "quiet" for no
    heartbeats."""
    ctx = zmq.Context.instance()
    router = FakeRouter(ctx)
    extra = list(getattr(request, "param", []))
    if "quiet" in extra:
        extra.remove("quiet")
        monkeypatch.setattr(worker_module, "HEARTBEAT_S", 3600.0)
    args = parse_args(["--id", "0", "--router", f"tcp://127.0.0.1:{router.port}", "--model", "tiny",
                       "--num-blocks", "32", *extra])
    w = Worker(args, build_engine(args), Codec(SECRET, router.ident.decode()))
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        yield router, w
    finally:
        router.send_header(encode(Stop()))
        t.join(10)
        router.sock.close(linger=0)
    assert not t.is_alive(), "the worker did not stop on `stop`"


def test_a_worker_generates_what_its_engine_generates(worker):
    router, w = worker
    hello = router.recv(lambda ms: isinstance(ms[-1], Hello))[-1]
    assert hello.worker_id == 0 and hello.blocks == 32 and hello.max_len == w.engine.max_model_len
    prompt = [5, 9, 2, 7, 7, 1, 30]
    router.send_header(encode(Gen(rid="a", prompt_ids=prompt, params=GREEDY, kind="full")))
    outs = router.recv(lambda ms: finished(ms[-1]))
    tokens = [t for m in outs if isinstance(m, Out) for i in m.items if i.rid == "a" for t in i.tokens]
    engine = LLMEngine("tiny", EngineConfig(num_blocks=32, tokenizer=None))
    alone = engine.generate([prompt], sampling_params(GREEDY))[0]
    assert tokens == alone.token_ids and len(tokens) == 6
    assert outs[-1].items[-1].reason == "length"


def test_a_reservation_that_cannot_fit_is_refused_with_its_reason(worker):
    router, w = worker
    router.recv(lambda ms: isinstance(ms[-1], Hello))
    too_long = [1] * (w.engine.max_model_len + 1)
    router.send_header(encode(Expect(rid="b", prompt_ids=too_long, params=GREEDY, src=1)))
    ans = router.recv(lambda ms: isinstance(ms[-1], Reserved))[-1]
    assert ans.rid == "b" and ans.ok is False and ans.msg
    router.send_header(encode(Expect(rid="c", prompt_ids=[1, 2, 3], params=GREEDY, src=1)))
    ans = router.recv(lambda ms: isinstance(ms[-1], Reserved))[-1]
    assert ans.rid == "c" and ans.ok is True and ans.blocks is None  # tcp: the worker writes, no blocks told


def test_a_malformed_message_is_dropped_counted_and_the_next_one_served(worker):
    router, w = worker
    router.recv(lambda ms: isinstance(ms[-1], Hello))
    bad = encode(Gen(rid="x", prompt_ids=[1, 2], params=GREEDY, kind="full"))
    bad["ids"] = [1, True]  # signed, but no valid gen
    router.send_header(bad)
    router.send_header(encode(Gen(rid="y", prompt_ids=[3, 4], params=GREEDY, kind="full")))
    got = router.recv(lambda ms: any(isinstance(m, Heartbeat) and m.rejected == 1 for m in ms)
                      and any(finished(m) for m in ms))
    rids = {i.rid for m in got if isinstance(m, Out) for i in m.items}
    assert rids == {"y"} and w.link.malformed == 1
    assert "x" not in w.kinds and not w.engine.has_unfinished()


CHUNKED = PolicyConfig(batching=BatchingConfig(chunk_size=4))
THREE = dataclasses.replace(GREEDY, max_tokens=3)


@pytest.mark.parametrize("worker", [["--policy", CHUNKED.to_json(), "quiet"]], indirect=True)
def test_a_busy_worker_sends_once_per_step(worker):
    """A 13-token prompt in chunks of 4, then 3 tokens: 4 prefill steps, then 2 decode steps.
    Each chunk's step is reported as it starts; each step's end is an `out` (empty for a chunk
    that is not the last: it makes no token). While steps follow one another, a step's `out`
    waits in the outbox and goes with the next step's report, just before that step runs; the
    last goes when the engine is idle. So 10 messages arrive in 7 sends (one per step, and the
    last `out`), where a send per message would be 10."""
    router, w = worker
    router.recv(lambda ms: isinstance(ms[-1], Hello))
    prompt = list(range(3, 16))
    start = len(router.sends)
    router.send_header(encode(Gen(rid="a", prompt_ids=prompt, params=THREE, kind="full")))
    got = router.recv(lambda ms: finished(ms[-1]))
    first = router.sends[start]
    got, sends = got[first:], [n - first for n in router.sends[start:]]
    assert [m.T for m in got] == ["step", "out", "step", "out", "step", "out", "step", "out", "out", "out"]
    assert sends == [0, 1, 3, 5, 7, 8, 9]  # where each began: step|out step|out step|out step|out|out|out
    assert [m.chunks for m in got if isinstance(m, Step)] == [[StepChunk("a", 4)]] * 3 + [[StepChunk("a", 1)]]
    assert [len(m.items) for m in got if isinstance(m, Out)] == [0, 0, 0, 1, 1, 1]
    tokens = [t for m in got if isinstance(m, Out) for i in m.items for t in i.tokens]
    alone = build_engine(w.args).generate([prompt], sampling_params(THREE))[0]
    assert tokens == alone.token_ids and len(tokens) == 3
