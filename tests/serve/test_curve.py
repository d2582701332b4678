"""CURVE encryption of the internal sockets (serve/curve.py): the auto rule, the keys derived from
the cluster secret, the frame-size limit, bytes on the wire, sockets without the key, and a live
cluster with --kv-encryption on that gives LLMEngine.generate's tokens."""

from __future__ import annotations

import hashlib
import socket
import threading
import time

import httpx
import pytest
import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from splitserve.errors import UserError
from splitserve.serve.curve import CURVE_FRAME_OVERHEAD, CurveKeys, encryption_on, is_loopback, require_curve
from splitserve.serve.kv.transports import Target, TcpTransport
from splitserve.serve.protocol import Codec, limit_socket

from .conftest import reference
from .test_lossless import assert_serves_like_generate, workload

SECRET = bytes(range(32))
OTHER_SECRET = bytes(range(1, 33))


# ---- the auto rule ---------------------------------------------------------------------------
@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True), ("::ffff:127.0.0.1", True),
    ("localhost", True), ("LOCALHOST", True), ("worker.localhost", True),
    ("0.0.0.0", False), ("::", False), ("*", False), ("10.0.0.5", False), ("192.168.1.20", False),
    ("fe80::1", False), ("128.0.0.1", False), ("node-3.cluster.internal", False), ("eth0", False),
    ("localhost.example.com", False),
])
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback
    assert encryption_on("auto", host) is (not loopback)
    assert encryption_on("on", host) is True
    assert encryption_on("off", host) is False


def test_auto_is_on_for_workers_on_a_ray_cluster_elsewhere():
    from splitserve.serve.config import ServeConfig

    assert encryption_on("auto", "127.0.0.1", remote_workers=True) is True
    assert ServeConfig().kv_encrypted() is False                               # the defaults: loopback
    assert ServeConfig(worker_host="0.0.0.0").kv_encrypted() is True
    assert ServeConfig(backend="ray").kv_encrypted() is False                  # a local Ray instance
    assert ServeConfig(backend="ray", ray_address="10.0.0.1:6379").kv_encrypted() is True
    assert ServeConfig(backend="ray", ray_address="10.0.0.1:6379", kv_encryption="off").kv_encrypted() is False
    assert ServeConfig(kv_encryption="on").kv_encrypted() is True


def test_bad_setting_is_one_error_line(capsys):
    from splitserve.cli import main

    assert main(["serve", "--kv-encryption", "maybe"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --kv-encryption must be auto, on or off, got 'maybe'"]
    with pytest.raises(UserError, match="auto, on or off"):
        encryption_on("yes", "127.0.0.1")


def test_libzmq_without_curve_is_named():
    assert zmq.has("curve")            # this pyzmq's bundled libzmq has it (the tests below need it)
    require_curve()
    with pytest.raises(UserError, match=r"built without CURVE \(zmq.has\('curve'\) is False\)"):
        require_curve(has=lambda capability: False)  # what a libzmq without it answers


# ---- keys ------------------------------------------------------------------------------------
def test_keys_are_derived_from_the_secret_alone():
    k = CurveKeys.from_secret(SECRET)
    raw = hashlib.blake2b(key=SECRET, digest_size=32, person=b"splitserve-curve").digest()
    assert k.secret == z85.encode(raw) and len(k.secret) == 40
    assert k.public == zmq.curve_public(k.secret) and len(k.public) == 40
    assert CurveKeys.from_secret(SECRET) == k                      # every process computes the same
    other = CurveKeys.from_secret(OTHER_SECRET)
    assert other.public != k.public and other.secret != k.secret
    with pytest.raises(ValueError):
        CurveKeys.from_secret(b"short")


# ---- sockets ---------------------------------------------------------------------------------
@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def delivered(sock: zmq.Socket, timeout_ms: int) -> list | None:
    return sock.recv_multipart() if sock.poll(timeout_ms) else None


def test_a_frame_of_exactly_the_limit_passes_encrypted(ctx):
    """limit_socket's bound is in plaintext bytes: CURVE's 33 wire bytes per frame are added."""
    k = CurveKeys.from_secret(SECRET)
    srv = ctx.socket(zmq.ROUTER)
    limit_socket(srv, 1000, hwm=10)
    k.server(srv)
    assert srv.getsockopt(zmq.MAXMSGSIZE) == 1000 + CURVE_FRAME_OVERHEAD
    port = srv.bind_to_random_port("tcp://127.0.0.1")
    for size, passes in ((1000, True), (1001, False)):
        c = ctx.socket(zmq.DEALER)
        c.linger = 0
        k.client(c)
        c.connect(f"tcp://127.0.0.1:{port}")
        c.send(b"x" * size)
        got = delivered(srv, 1000)
        assert (got is not None and got[1] == b"x" * size) is passes, size
        c.close()
    # without the added overhead a frame of exactly the limit would be refused: 33 bytes is exact
    for overhead, passes in ((CURVE_FRAME_OVERHEAD - 1, False), (CURVE_FRAME_OVERHEAD, True)):
        s2 = ctx.socket(zmq.ROUTER)
        s2.setsockopt(zmq.MAXMSGSIZE, 1000 + overhead)
        s2.curve_secretkey, s2.curve_publickey, s2.curve_server = k.secret, k.public, True
        p2 = s2.bind_to_random_port("tcp://127.0.0.1")
        c = ctx.socket(zmq.DEALER)
        c.linger = 0
        k.client(c)
        c.connect(f"tcp://127.0.0.1:{p2}")
        c.send(b"x" * 1000)
        assert (delivered(s2, 1000) is not None) is passes, overhead
        c.close()
        s2.close(linger=0)


class Relay:
    """A TCP relay on 127.0.0.1 that forwards every connection to `port` and keeps a copy of the
    bytes going each way: what anyone on the path between two workers would see."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.wire = bytearray()
        self.lock = threading.Lock()
        self.socks: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                a, _ = self.listener.accept()
            except OSError:
                return
            b = socket.create_connection(("127.0.0.1", self.target))
            self.socks += [a, b]
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(1 << 16):
                with self.lock:
                    self.wire += chunk
                dst.sendall(chunk)
        except OSError:
            pass

    def close(self) -> None:
        for s in self.socks:
            s.close()


@pytest.mark.parametrize("encrypted", [False, True])
def test_bytes_on_the_wire_are_not_plaintext_when_encrypted(ctx, encrypted):
    keys = CurveKeys.from_secret(SECRET) if encrypted else None
    receiver = TcpTransport(ctx, Codec(SECRET, "token-worker"), curve=keys)
    sender = TcpTransport(ctx, Codec(SECRET, "prompt-worker"), curve=keys)
    relay = Relay(int(receiver.address.rsplit(":", 1)[1]))
    kv = b"KV-BYTES-OF-LAYER-0:" * 500
    try:
        target = Target(peer=1, ident="token-worker", address=f"tcp://127.0.0.1:{relay.port}")
        assert sender.send(target, {"t": "kvl", "rid": "request-with-a-readable-id", "layer": 0}, kv)
        got: list = []
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            receiver.inbound.poll(100)
            got = receiver.recv_all()
        assert len(got) == 1
        header, data = got[0]
        assert header["rid"] == "request-with-a-readable-id" and bytes(data[0]) == kv  # delivered intact
        with relay.lock:
            wire = bytes(relay.wire)
        assert len(wire) > len(kv)
        for plain in (b"KV-BYTES-OF-LAYER-0:", b"request-with-a-readable-id", b"prompt-worker"):
            assert (plain in wire) is (not encrypted), plain
        if encrypted:
            assert b"CURVE" in wire and b"MESSAGE" in wire  # the mechanism's name and command, in clear
    finally:
        relay.close()
        sender.close()
        receiver.close()


def handshake_events(mon: zmq.Socket, seconds: float) -> list[str]:
    events, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        if mon.poll(50):
            events.append(zmq.Event(recv_monitor_message(mon)["event"]).name)
    return events


def knock(ctx: zmq.Context, address: str, frames: list, keys: CurveKeys | None,
          ident: bytes | None = None) -> list[str]:
    """Connect a DEALER (CURVE client with `keys`, or none) to `address`, send `frames`; the
    handshake events the DEALER saw in 1 s."""
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    if ident is not None:
        s.setsockopt(zmq.IDENTITY, ident)
    if keys is not None:
        keys.client(s)
    mon = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                               | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    s.connect(address)
    s.send_multipart(frames)
    try:
        return handshake_events(mon, 1.0)
    finally:
        s.disable_monitor()
        mon.close(linger=0)
        s.close(linger=0)


@pytest.mark.parametrize("client", ["no CURVE", "another secret's keys"])
def test_a_socket_without_the_key_is_not_heard(ctx, client):
    keys = CurveKeys.from_secret(SECRET)
    receiver = TcpTransport(ctx, Codec(SECRET, "token-worker"), curve=keys)
    try:
        # even a message signed with the cluster secret: the handshake fails before any frame
        frames = Codec(SECRET, "prompt-worker").encode({"t": "kvs", "rid": "r1"}, to="token-worker")
        events = knock(ctx, receiver.address, frames, None if client == "no CURVE" else
                       CurveKeys.from_secret(OTHER_SECRET))
        assert events and "HANDSHAKE_SUCCEEDED" not in events, events
        assert all(e.startswith("HANDSHAKE_FAILED") for e in events), events
        assert receiver.recv_all() == [] and receiver.codec.rejected == 0  # nothing reached the codec
        # the same frames from a client with the cluster's keys are delivered and verified
        assert knock(ctx, receiver.address, frames, keys) == ["HANDSHAKE_SUCCEEDED"]
        got = receiver.recv_all()
        assert [(h["t"], h["rid"], h["_from"]) for h, _ in got] == [("kvs", "r1", "prompt-worker")]
    finally:
        receiver.close()


# ---- live ------------------------------------------------------------------------------------
def test_live_cluster_encrypted_on_loopback_is_lossless_and_deaf_to_strangers(server_factory, reference_engine):
    srv = server_factory("--prompt-workers", "1", "--token-workers", "1", "--kv-encryption", "on",
                         "--layerwise-threshold", "64")  # both transfer modes: layer-wise from 64 tokens
    st = srv.state()
    assert st["kv_encryption"] is True

    prompts, max_tokens = workload(24, seed=5)
    assert_serves_like_generate(srv, reference_engine, prompts, max_tokens)
    split = [len(p) for p, m in zip(prompts, max_tokens) if m > 1]  # one-token requests stay put
    transfers = sum(srv.metric("splitserve_kv_transfers_total", mode=m) for m in ("layerwise", "serialized"))
    assert transfers == len(split)
    # tiny: 2 layers x (K, V) x 2 KV heads x 16 dims x 4 bytes = 512 bytes per prompt token
    assert sum(srv.metric("splitserve_kv_transfer_bytes_total", mode=m)
               for m in ("layerwise", "serialized")) == 512 * sum(split)

    # strangers at the router's control port and at the token worker's KV port: a raw DEALER
    # without keys, one with another cluster's keys, one posing as worker 1 (its old identity)
    token = st["workers"][1]
    ctx = zmq.Context()
    try:
        for address in (st["router_address"], token["kv_addr"]):
            for keys in (None, CurveKeys.from_secret(OTHER_SECRET)):
                events = knock(ctx, address, [b"\0" * 16, b"hello?"], keys, ident=b"w1.1")
                assert events and all(e.startswith("HANDSHAKE_FAILED") for e in events), (address, events)
    finally:
        ctx.destroy(linger=0)
    after = srv.state()
    # nothing got as far as the router's or the worker's message handling: not even counted
    assert after["rejected_messages"] == st["rejected_messages"] == 0, after["rejected_by"]
    assert [w["rejected_messages"] for w in after["workers"]] == [0, 0]
    assert [w["restarts"] for w in after["workers"]] == [0, 0] and all(w["up"] for w in after["workers"])

    # and it keeps serving, with the same tokens; alone in its batch, an 80-token prompt moves
    # layer by layer and a 3-token one in one shot (the threshold counts the batch's prompt tokens)
    for prompt, mode in ((list(range(40, 120)), "layerwise"), ([5, 6, 7], "serialized")):
        n = srv.metric("splitserve_kv_transfers_total", mode=mode)
        r = httpx.post(srv.url + "/v1/completions", timeout=30, json={"model": "tiny", "prompt": prompt,
                                                                      "max_tokens": 9, "temperature": 0,
                                                                      "ignore_eos": True})
        assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == reference(
            reference_engine, [prompt], [9], ignore_eos=True)[0]
        assert srv.metric("splitserve_kv_transfers_total", mode=mode) == n + 1
    st = srv.wait_settled()
    assert all(w["free"] == w["start_free"] and w["reserved"] == 0 for w in st["workers"]), st["workers"]


def test_auto_on_loopback_leaves_the_default_cluster_unencrypted(split_server):
    assert split_server.state()["kv_encryption"] is False
