"""`--transport nccl` (serve/kv/collective.py, pairs.py): K/V by torch.distributed send/recv over a
two-rank group per pair of workers, gloo here on CPU (NCCL runs the same code on CUDA).

In process: two transports move layers and whole caches, in order, in float32 and bfloat16; a
sender that dies with a receive posted fails that transfer at once (its `kvd` arrives without
K/V) and the next sender pairs anew; `drop_peer` fails what waits; the refusals. Live: a 1P + 1T
server gives the engine's greedy tokens layer-wise and serialized, and a token or prompt worker
killed mid-transfer loses no request."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import msgpack
import pytest
import torch

from .conftest import complete, reference
from .test_lossless import assert_serves_like_generate, workload
from .test_transports import poll_state, ready_settled

SECRET = b"0123456789abcdef0123456789abcdef"


@pytest.fixture
def ctx():
    import zmq

    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def transport(ctx, name: str, device="cpu", timeout_s: float = 10.0):
    from splitserve.serve.kv import make_transport
    from splitserve.serve.protocol import Codec

    return make_transport("nccl", ctx, Codec(SECRET, name), "127.0.0.1", device=device, timeout_s=timeout_s)


def target(rx, peer: int = 1, ident: str = "w1.1.b"):
    from splitserve.serve.kv import Target

    return Target(peer, ident, rx.address, {"region": rx.region, "blocks": None})


def drain(rx, n: int, timeout: float = 30.0) -> list:
    """The next `n` messages `rx` hands over, polled as a worker's loop does (30 s: a clean-clone CI
    run under load once got nothing in 10 s on the first transfer of a new pair, 2026-11-28)."""
    import zmq

    poller = zmq.Poller()
    poller.register(rx.inbound, zmq.POLLIN)
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        if poller.poll(50):
            got += rx.recv_all()
    return got


def test_layers_and_whole_caches_move_in_order(ctx):
    from splitserve.serve.messages import KvDone, KvLayer, KvStart, encode

    tx, rx = transport(ctx, "w0.1.a"), transport(ctx, "w1.1.b")
    try:
        assert rx.region["kind"] == "collective" and rx.region["backend"] == "gloo" and rx.region["gpu"] is None
        to = target(rx)
        for dtype in (torch.float32, torch.bfloat16):
            layers = [torch.randn(2, 37, 2, 16).to(dtype) for _ in range(4)]
            whole = torch.randn(4, 2, 9, 2, 16).to(dtype)
            tx.send(to, encode(KvStart(rid="r")))
            for i, kv in enumerate(layers):
                put = tx.put(to, i, kv)
                assert put.meta is None and len(put.frames) == 1  # a descriptor, not the bytes
                assert len(put.frames[0]) < 100
                assert tx.send(to, encode(KvLayer(rid="r", layer=i, sent_at=1.0)), *put.frames)
            put = tx.put(to, None, whole)
            assert put.meta == {"num_layers": 4, "num_tokens": 9, "num_kv_heads": 2, "head_dim": 16,
                                "dtype": str(dtype).removeprefix("torch.")}
            tx.send(to, encode(KvDone(rid="r", first_token=3, prefill_end=1.0, mode="serialized", sent_at=1.0,
                                      meta=put.meta)), *put.frames)
            got = drain(rx, 6)
            assert [h["t"] for h, _ in got] == ["kvs", "kvl", "kvl", "kvl", "kvl", "kvd"]
            assert got[0][1] == []
            for (h, data), want in zip(got[1:], [*layers, whole]):
                assert data[0].dtype == dtype and torch.equal(data[0], want)
            assert [h["layer"] for h, _ in got[1:5]] == [0, 1, 2, 3]
        assert len(tx.out) == 1 and len(rx.pairs.links) == 1 and rx.failed == 0  # one pair, made once
    finally:
        tx.close()
        rx.close()


SENDER = textwrap.dedent("""
    import os, sys, time, msgpack, torch, zmq
    from splitserve.serve.kv import Target, make_transport
    from splitserve.serve.messages import KvDone, KvLayer, encode
    from splitserve.serve.protocol import Codec
    region, address = msgpack.unpackb(sys.stdin.buffer.read())
    tx = make_transport("nccl", zmq.Context(), Codec(bytes.fromhex(sys.argv[1]), "w0.1.a"), "127.0.0.1",
                        device="cpu", timeout_s=10)
    to = Target(1, "w1.1.b", address, {"region": region, "blocks": None})
    put = tx.put(to, 0, torch.ones(2, 5, 2, 16))
    tx.send(to, encode(KvLayer(rid="r", layer=0, sent_at=1.0)), *put.frames)
    link = next(iter(tx.out.values()))
    # layer 1 announced, but its send never posted: the receiver waits on it when we die
    fake = msgpack.packb({"p": link.id, "s": link.seq + 1, "shape": [2, 5, 2, 16], "dtype": "float32"})
    tx.send(to, encode(KvLayer(rid="r", layer=1, sent_at=1.0)), fake)
    tx.send(to, encode(KvDone(rid="r", first_token=3, prefill_end=1.0, mode="layerwise", sent_at=1.0)))
    time.sleep(0.5)
    print("dying", flush=True)
    os._exit(0)
""")


def test_a_sender_that_dies_fails_its_transfer_at_once(ctx):
    rx = transport(ctx, "w1.1.b", timeout_s=60)  # the group's timeout is not what ends the wait
    try:
        proc = subprocess.Popen([sys.executable, "-c", SENDER, SECRET.hex()], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdin.write(msgpack.packb([rx.region, rx.address]))
        proc.stdin.close()
        got = drain(rx, 2, timeout=60)  # as a worker's loop: layer 0 arrives while the sender lives
        assert proc.wait(timeout=60) == 0 and b"dying" in proc.stdout.read(), proc.stderr.read().decode()[-2000:]
        # layer 0 came; layer 1's receive failed (the pair closed): dropped; the kvd has no K/V
        assert [(h["t"], len(d)) for h, d in got] == [("kvl", 1), ("kvd", 0)]
        assert torch.equal(got[0][1][0], torch.ones(2, 5, 2, 16)) and rx.failed == 1
        assert not rx.held
        # the next sender pairs anew and is served
        tx = transport(ctx, "w0.2.c")
        try:
            from splitserve.serve.messages import KvLayer, encode

            put = tx.put(target(rx), 0, torch.full((2, 3, 2, 16), 7.0))
            tx.send(target(rx), encode(KvLayer(rid="s", layer=0, sent_at=1.0)), *put.frames)
            ((h, d),) = drain(rx, 1)
            assert h["rid"] == "s" and torch.equal(d[0], torch.full((2, 3, 2, 16), 7.0))
            assert len(rx.pairs.links) == 2
        finally:
            tx.close()
    finally:
        rx.close()


def test_a_wake_read_with_the_messages_does_not_silence_the_next(ctx):
    """A waiter thread that wakes the loop while `recv_all` reads its socket: that wake is read
    there, and the next one must still reach the socket (else a receive that completes next waits
    for an unrelated message: CI, 2026-11-28, a whole batch of transfers timed out that way)."""
    import zmq

    rx = transport(ctx, "w1.1.b")
    try:
        inbound, raced = rx.inbound, []

        class Racing:  # the inbound socket, with a waiter thread's wake landing as recv_all reads it
            def recv_multipart(self, *a, **kw):
                if not raced:
                    raced.append(rx._wake())
                    time.sleep(0.2)  # the wake's frame is now readable
                return inbound.recv_multipart(*a, **kw)

        rx.inbound = Racing()
        assert rx.recv_all() == [] and raced
        rx.inbound = inbound
        assert not inbound.poll(200)  # that wake was read
        rx._wake()  # the next receive completes
        assert inbound.poll(2000) == zmq.POLLIN
    finally:
        rx.close()


def test_drop_peer_fails_what_waits_for_it(ctx):
    from splitserve.serve.kv.collective import Held
    from splitserve.serve.messages import KvLayer, encode

    tx, rx = transport(ctx, "w3.1.a"), transport(ctx, "w1.1.b")
    try:
        to = target(rx)
        put = tx.put(to, 0, torch.ones(2, 3, 2, 16))
        tx.send(to, encode(KvLayer(rid="r", layer=0, sent_at=1.0)), *put.frames)
        assert len(drain(rx, 1)) == 1
        # a message still waiting for its K/V from worker 3 (the router says it is down)
        rx.held["w3.1.a"] = __import__("collections").deque(
            [Held({"t": "kvl"}, {"p": "9", "s": 9, "shape": [1], "dtype": "float32"}, state="wait", posted=True),
             Held({"t": "kvd", "rid": "r"})])
        rx.drop_peer(3)
        assert not rx.pairs.links
        assert rx.recv_all() == [({"t": "kvd", "rid": "r"}, [])] and rx.failed == 1
        tx.drop_peer(1)
        assert not tx.out
    finally:
        tx.close()
        rx.close()


def test_the_store_listens_on_its_host_only_and_outlives_garbage(ctx):
    from datetime import timedelta

    from torch.distributed import TCPStore

    from splitserve.serve.kv.pairs import PAIRS
    from splitserve.serve.messages import KvLayer, encode

    rx = transport(ctx, "w1.1.b")
    try:
        port = int(rx.pairs.address.rpartition(":")[2])
        if os.path.exists("/proc/net/tcp"):  # listening (state 0A) on 127.0.0.1, not on every interface
            listening = [line.split()[1] for f in ("/proc/net/tcp", "/proc/net/tcp6") if os.path.exists(f)
                         for line in open(f).readlines()[1:] if line.split()[3] == "0A"
                         and line.split()[1].endswith(f":{port:04X}")]
            assert listening == [f"0100007F:{port:04X}"]
        # someone else on the host claims pair numbers and writes junk: skipped, pairs still join
        other = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
        n = other.add(PAIRS, 1)
        other.set(f"pair/{n}", b"\xc1 not msgpack")
        other.set(f"pair/{n + 1}", b"\x93\x01\x02\x03")  # msgpack, not a map
        other.add(PAIRS, 1)
        tx = transport(ctx, "w0.1.a")
        try:
            put = tx.put(target(rx), 0, torch.ones(2, 3, 2, 16))
            tx.send(target(rx), encode(KvLayer(rid="r", layer=0, sent_at=1.0)), *put.frames)
            ((h, d),) = drain(rx, 1)
            assert torch.equal(d[0], torch.ones(2, 3, 2, 16)) and list(rx.pairs.links) == [str(n + 2)]
        finally:
            tx.close()
    finally:
        rx.close()


def test_refusals(ctx):
    from splitserve.errors import UserError
    from splitserve.serve.config import ServeConfig
    from splitserve.serve.curve import CurveKeys
    from splitserve.serve.kv import Target, TransportError, TransportUnavailable
    from splitserve.serve.kv.collective import CollectiveTransport
    from splitserve.serve.protocol import Codec

    codec = Codec(SECRET, "w0.1.a")
    with pytest.raises(TransportUnavailable, match="echo workers.*--transport tcp"):
        CollectiveTransport(ctx, codec, device=None)
    with pytest.raises(TransportUnavailable, match="unencrypted.*--kv-encryption off"):
        CollectiveTransport(ctx, codec, device="cpu", curve=CurveKeys.from_secret(SECRET))
    tx, rx = transport(ctx, "w0.1.a"), transport(ctx, "w1.1.b")
    try:
        kv = torch.ones(2, 3, 2, 16)
        with pytest.raises(TransportError, match="no KV store"):
            tx.put(Target(1, "w1.1.b", rx.address), 0, kv)
        with pytest.raises(TransportError, match="over nccl.*same kind of device"):
            tx.put(Target(1, "w1.1.b", rx.address, {"region": {**rx.region, "backend": "nccl"}}), 0, kv)
        tx.uuid = "GPU-same"  # as if both workers were on one GPU
        with pytest.raises(TransportError, match="on this worker's GPU.*NCCL cannot join two ranks on one GPU"):
            tx.put(Target(1, "w1.1.b", rx.address, {"region": {**rx.region, "gpu": "GPU-same"}}), 0, kv)
        tx.uuid = None
        with pytest.raises(TransportError, match="cannot join a KV pair with worker 1"):
            tx.put(Target(1, "w1.1.b", rx.address, {"region": {**rx.region, "store": "127.0.0.1:1"}}), 0, kv)
    finally:
        tx.close()
        rx.close()
    ServeConfig(transport="nccl").validate()
    ServeConfig(transport="nccl", device="cuda").validate()
    for kw, why in [({"worker_mode": "echo"}, "echo workers have none"),
                    ({"device": "cuda:0"}, "every worker on one GPU.*NCCL cannot join two ranks"),
                    ({"kv_encryption": "on"}, "unencrypted.*--kv-encryption off"),
                    ({"worker_host": "10.0.0.5"}, "unencrypted")]:
        with pytest.raises(UserError, match=why):
            ServeConfig(transport="nccl", **kw).validate()
    ServeConfig(transport="nccl", worker_host="10.0.0.5", kv_encryption="off").validate()


# ---- live clusters ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode,threshold", [("layerwise", "0"), ("serialized", "1000000")])
def test_nccl_transport_is_lossless(mode, threshold, server_factory, reference_engine, tmp_path):
    log = tmp_path / "serve.log"
    srv = server_factory("--prompt-workers", "1", "--token-workers", "1", "--transport", "nccl",
                         "--layerwise-threshold", threshold, log_path=log)
    prompts, max_tokens = workload(24, seed=11)
    assert_serves_like_generate(srv, reference_engine, prompts, max_tokens)
    split = [len(p) for p, m in zip(prompts, max_tokens) if m > 1]  # one-token requests stay put
    assert len(split) >= 20
    other = "serialized" if mode == "layerwise" else "layerwise"
    assert srv.metric("splitserve_kv_transfers_total", mode=mode) == len(split)
    assert srv.metric("splitserve_kv_transfers_total", mode=other) == 0
    assert srv.metric("splitserve_kv_transfer_failures_total") == 0
    # tiny: 2 layers x (K, V) x 2 KV heads x 16 dims x 4 bytes = 512 bytes per prompt token
    assert srv.metric("splitserve_kv_transfer_bytes_total", mode=mode) == 512 * sum(split)
    ready_settled(srv)
    assert log.read_text().count("--transport nccl on cpu: KV moves over torch.distributed gloo") == 2


def slow_pair(server_factory):
    """1P + 1T on nccl, every prompt layer-wise, 0.5 s per prefill layer (layer 0 is at the token
    worker while layer 1 'computes')."""
    srv = server_factory("--prompt-workers", "1", "--token-workers", "1", "--transport", "nccl",
                         "--layerwise-threshold", "0", "--debug-layer-delay", "0.5", "--transfer-timeout", "2")
    ws = srv.state()["workers"]
    return srv, next(w for w in ws if w["home"] == "prompt"), next(w for w in ws if w["home"] == "token")


@pytest.mark.parametrize("victim", ["token", "prompt"])
def test_a_worker_killed_mid_transfer_loses_no_request(victim, server_factory, reference_engine):
    srv, prompt_w, token_w = slow_pair(server_factory)
    dead = token_w if victim == "token" else prompt_w
    prompt = list(range(10, 50))
    want = reference(reference_engine, [prompt], [8], ignore_eos=True)[0]
    restarts0 = srv.metric("splitserve_request_restarts_total")

    async def run():
        async with httpx.AsyncClient(timeout=90) as client:
            task = asyncio.create_task(complete(client, srv.url, prompt, 8, stream=True, ignore_eos=True))

            def started(s):
                t = s["workers"][token_w["id"]]
                busy = [m for m in s["machines"] if m["home"] == "prompt" and m["prefill_tokens_running"]]
                return t["reserved"] == 1 and t["free"] < t["start_free"] and busy

            await poll_state(client, srv.url, started, 20, "the transfer never started")
            await asyncio.sleep(0.2)  # inside the layer-0 delay: mid-transfer
            os.kill(dead["pid"], signal.SIGKILL)
            return await task

    status, toks, _ = asyncio.run(run())
    assert status == 200 and toks == want  # restarted (on the replacement), completed
    assert srv.metric("splitserve_request_restarts_total") > restarts0
    st = ready_settled(srv)
    assert st["workers"][dead["id"]]["pid"] != dead["pid"]
    # the replacement pairs anew: more requests, all moved over the collective link
    before = srv.metric("splitserve_kv_transfers_total", mode="layerwise")
    prompts = [list(range(20 + i, 40 + i)) for i in range(3)]

    async def more():
        async with httpx.AsyncClient(timeout=90) as client:
            return await asyncio.gather(*(complete(client, srv.url, p, 4, stream=False, ignore_eos=True)
                                          for p in prompts))

    res = asyncio.run(more())
    assert [r[1] for r in res] == reference(reference_engine, prompts, [4] * 3, ignore_eos=True)
    assert srv.metric("splitserve_kv_transfers_total", mode="layerwise") == before + 3
    ready_settled(srv)
