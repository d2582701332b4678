"""The signed wire format (protocol.py): round trips, tampering, replay, misdirection, forged
senders, the cheap-first order of the checks, worker identities, and ZeroMQ's frame size limit on
real sockets over tcp://127.0.0.1."""

from __future__ import annotations

import hashlib
import time

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.serve.protocol import (
    ENVELOPE,
    MAC_BYTES,
    BadMessage,
    Codec,
    control_message_limit,
    limit_socket,
    worker_identity,
)

SECRET = b"0123456789abcdef0123456789abcdef"
W1 = worker_identity(SECRET, 1, 1).decode()
W2 = worker_identity(SECRET, 2, 1).decode()


def reason(codec: Codec, frames: list, sender=None) -> str:
    with pytest.raises(BadMessage) as e:
        codec.decode(frames, sender)
    return e.value.reason


def flip(frame, i: int) -> bytes:
    b = bytearray(memoryview(frame).cast("B"))
    b[i] ^= 0x01
    return bytes(b)


# ---- round trips ---------------------------------------------------------------------------
def test_round_trip_bytes_numpy_memoryview_frame():
    router, worker = Codec(SECRET, "router"), Codec(SECRET, W1)
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    header = {"t": "kvl", "rid": "7.0", "layer": 3, "ids": [1, 2, 3], "x": None, "b": b"\x00\xff"}
    frames = router.encode(header, b"raw", arr, memoryview(b"view"), zmq.Frame(b"frame"), to=W1)
    assert len(frames) == 6 and len(frames[0]) == MAC_BYTES
    h, data = worker.decode([zmq.Frame(bytes(memoryview(f).cast("B"))) for f in frames])
    assert h == {**header, "_from": "router"}
    assert [bytes(d) for d in data] == [b"raw", arr.tobytes(), b"view", b"frame"]
    assert all(isinstance(d, memoryview) for d in data)  # zmq.Frame buffers, not copies
    np.testing.assert_array_equal(np.frombuffer(data[1], np.float32).reshape(3, 4), arr)
    assert worker.rejected == 0


_values = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False)
                       | st.text(max_size=20) | st.binary(max_size=20),
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                   max_size=4), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(fields=st.dictionaries(st.text(max_size=10).filter(lambda k: k not in ENVELOPE), _values, max_size=6),
       t=st.text(min_size=1, max_size=8), data=st.lists(st.binary(max_size=300), max_size=5))
def test_round_trip_property(fields, t, data):
    tx, rx = Codec(SECRET, "router"), Codec(SECRET, W1)
    header = {**fields, "t": t}
    h, out = rx.decode(tx.encode(header, *data, to=W1), sender="router")
    assert h == {**header, "_from": "router"}
    assert [bytes(d) for d in out] == data


def test_reserved_header_keys_are_refused():
    with pytest.raises(ValueError):
        Codec(SECRET, "router").encode({"t": "gen", "_to": W2}, to=W1)


def test_round_trip_over_zeromq_router_dealer():
    """The router's flow: the worker's DEALER has its worker_identity, the ROUTER passes the
    identity it received on as `sender`; a reply goes back to the same identity."""
    ctx = zmq.Context()
    try:
        router_sock, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
        ident = worker_identity(SECRET, 1, 1)
        dealer.setsockopt(zmq.IDENTITY, ident)
        port = router_sock.bind_to_random_port("tcp://127.0.0.1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        router, worker = Codec(SECRET, "router"), Codec(SECRET, ident.decode())
        kv = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
        dealer.send_multipart(worker.encode({"t": "hello", "id": 1}, kv, to="router"), copy=False)
        assert router_sock.poll(5000)
        fr = router_sock.recv_multipart(copy=False)
        h, data = router.decode(fr[1:], sender=fr[0])
        assert h["_from"] == ident.decode() and h["id"] == 1
        np.testing.assert_array_equal(np.frombuffer(data[0], np.float32).reshape(4, 64), kv)
        router_sock.send_multipart([ident, *router.encode({"t": "stop"}, to=ident.decode())])
        assert dealer.poll(5000)
        assert worker.decode(dealer.recv_multipart(copy=False))[0] == {"t": "stop", "_from": "router"}
    finally:
        ctx.destroy(linger=0)


# ---- rejections ----------------------------------------------------------------------------
def test_every_tampered_byte_is_rejected_with_its_reason():
    tx, rx = Codec(SECRET, "router"), Codec(SECRET, W1)
    frames = tx.encode({"t": "kvl", "rid": "1.0"}, b"abcdefgh", np.arange(4, dtype=np.float32), to=W1)
    mac, head, *data = frames
    for i in range(len(mac)):
        assert reason(rx, [flip(mac, i), head, *data]) == "mac"
    for i in range(len(head)):
        assert reason(rx, [mac, flip(head, i), *data]) == "mac"
    for k, d in enumerate(data):
        for i in range(memoryview(d).nbytes):
            altered = list(data)
            altered[k] = flip(d, i)
            assert reason(rx, [mac, head, *altered]) == "digest"
    d0, d1 = bytes(data[0]), np.asarray(data[1]).tobytes()
    for altered in ([d0[:-1], d1], [d0 + b"x", d1], [d0 + d1[:1], d1[1:]], [d0], [d0, d1, b""], [d1, d0]):
        assert reason(rx, [mac, head, *altered]) == "digest"  # lengths, boundaries, count, order
    assert reason(rx, [mac[:-1], head, *data]) == "mac"
    assert reason(rx, [mac]) == "format"
    n = len(mac) + len(head) + sum(memoryview(d).nbytes for d in data) + 6 + 2
    assert rx.rejected == n and sum(rx.rejected_by.values()) == n
    h, _ = rx.decode(frames)  # no failed attempt advanced the counter: the genuine message passes
    assert h["rid"] == "1.0"


def test_a_replayed_or_reordered_message_is_rejected():
    tx, rx = Codec(SECRET, "router"), Codec(SECRET, W1)
    m1, m2, m3 = (tx.encode({"t": "gen", "n": i}, to=W1) for i in range(3))
    rx.decode(m1)
    assert reason(rx, m1) == "replay"
    rx.decode(m3)
    assert reason(rx, m2) == "replay"  # overtaken: older than the last accepted
    assert rx.rejected_by == {"replay": 2}


def test_a_restarted_sender_with_the_same_name_counts_upwards():
    rx = Codec(SECRET, W1)
    rx.decode(Codec(SECRET, "router").encode({"t": "gen"}, to=W1))
    rx.decode(Codec(SECRET, "router").encode({"t": "gen"}, to=W1))


def test_a_message_for_another_endpoint_is_rejected():
    tx = Codec(SECRET, "router")
    frames = tx.encode({"t": "gen"}, to=W1)
    assert reason(Codec(SECRET, W2), frames) == "destination"
    assert reason(Codec(SECRET, "router"), frames) == "destination"
    Codec(SECRET, W1).decode(frames)


def test_sender_must_match_the_routing_identity():
    w1, w2, router = Codec(SECRET, W1), Codec(SECRET, W2), Codec(SECRET, "router")
    frames = w1.encode({"t": "hb"}, to="router")
    assert reason(router, frames, sender=W2.encode()) == "sender"
    assert reason(router, frames, sender=zmq.Frame(W2.encode())) == "sender"
    assert reason(router, w2.encode({"t": "hb"}, to="router"), sender=W1) == "sender"
    assert router.decode(frames, sender=zmq.Frame(W1.encode()))[0]["_from"] == W1


def test_a_wrong_secret_is_rejected():
    forged = Codec(b"not-the-cluster-secret-at-all!!!", "router")
    rx = Codec(SECRET, W1)
    assert reason(rx, forged.encode({"t": "gen"}, to=W1)) == "mac"
    assert reason(rx, forged.encode({"t": "kvl"}, b"x" * 100, to=W1)) == "mac"
    assert rx.rejected_by == {"mac": 2}


def test_a_signed_head_of_the_wrong_shape_is_rejected_as_format():
    rx = Codec(SECRET, W1)
    seq = time.time_ns()
    for obj in ([1, 2], {"t": "gen", "_to": W1, "_seq": seq}, {"_from": "router", "_to": W1, "_seq": seq, "_data": None},
                {"t": "gen", "_from": "router", "_to": W1, "_seq": "1", "_data": None},
                {"t": "gen", "_from": "router", "_to": W1, "_seq": seq, "_data": "str"}):
        head = msgpack.packb(obj)
        h = rx._mac0.copy()
        h.update(head)
        assert reason(rx, [h.digest(), head]) == "format"
    h = rx._mac0.copy()
    h.update(b"\xc1")
    assert reason(rx, [h.digest(), b"\xc1"]) == "format"


def test_too_many_data_frames_are_rejected_before_hashing():
    tx, rx = Codec(SECRET, "router"), Codec(SECRET, W1, max_data_frames=4)
    assert reason(rx, tx.encode({"t": "kvd"}, *[b"x"] * 5, to=W1)) == "size"
    rx.decode(tx.encode({"t": "kvd"}, *[b"x"] * 4, to=W1))


def test_the_sender_table_is_bounded_least_recent_first():
    rx = Codec(SECRET, "router", max_senders=3)
    names = [worker_identity(SECRET, i, 1).decode() for i in range(5)]
    codecs = {n: Codec(SECRET, n) for n in names}
    for n in names[:3]:
        rx.decode(codecs[n].encode({"t": "hb"}, to="router"))
    rx.decode(codecs[names[0]].encode({"t": "hb"}, to="router"))  # names[0] heard from again
    rx.decode(codecs[names[3]].encode({"t": "hb"}, to="router"))
    assert list(rx._last) == [names[2], names[0], names[3]]  # names[1] was forgotten


# ---- cheap first ---------------------------------------------------------------------------
def test_an_unauthenticated_huge_frame_is_rejected_without_hashing_it():
    rx = Codec(SECRET, W1)
    big = bytes(200 << 20)
    head = msgpack.packb({"t": "kvd", "_from": "router", "_to": W1, "_seq": time.time_ns(), "_data": bytes(16)})
    t0 = time.perf_counter()
    hashlib.blake2b(big, key=SECRET, digest_size=16).digest()  # what verifying the data would take
    hashing = time.perf_counter() - t0
    rejecting = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        assert reason(rx, [bytes(16), head, big]) == "mac"
        rejecting = min(rejecting, time.perf_counter() - t0)
    assert rejecting < hashing / 10, (rejecting, hashing)


class _SpyHasher:
    def __init__(self, inner) -> None:
        self.inner, self.hashed = inner, 0

    def copy(self):
        spy = self

        class _H:
            def __init__(self) -> None:
                self.h = spy.inner.copy()

            def update(self, b) -> None:
                spy.hashed += memoryview(b).nbytes
                self.h.update(b)

            def digest(self) -> bytes:
                return self.h.digest()
        return _H()


def test_a_head_over_max_head_is_rejected_before_hashing():
    tx, rx = Codec(SECRET, "router"), Codec(SECRET, W1, max_head=1024)
    rx._mac0 = _SpyHasher(rx._mac0)
    assert reason(rx, tx.encode({"t": "gen", "ids": list(range(1000))}, to=W1)) == "size"
    assert rx._mac0.hashed == 0 and rx.rejected_by == {"size": 1}
    fits = tx.encode({"t": "gen", "ids": list(range(100))}, to=W1)
    rx.decode(fits)
    assert rx._mac0.hashed == len(fits[1]) <= 1024
    assert Codec(SECRET, W1).max_head == 4 << 20  # the default


# ---- worker identities ---------------------------------------------------------------------
def test_worker_identity():
    a = worker_identity(SECRET, 3, 2)
    assert a == worker_identity(SECRET, 3, 2)  # router and worker agree
    assert a.startswith(b"w3.2.") and len(a) == len(b"w3.2.") + 16
    int(a[5:], 16)
    assert not a.startswith(b"\x00") and len(a) < 256  # a valid ZeroMQ routing identity
    assert len({worker_identity(SECRET, i, g) for i in range(20) for g in range(20)}) == 400
    assert worker_identity(b"another-secret-of-32-bytes......", 3, 2) != a
    tails = {worker_identity(bytes([i]) * 32, 0, 1)[5:] for i in range(256)}
    assert len(tails) == 256  # the unguessable part depends on the secret
    assert worker_identity(SECRET, 12, 3)[:6] == b"w12.3." and worker_identity(SECRET, 1, 23)[:6] == b"w1.23."
    with pytest.raises(ValueError):
        worker_identity(b"short", 0, 1)


# ---- size limits on real sockets -----------------------------------------------------------
LIMIT = 4096


def _recv(sock: zmq.Socket, timeout_ms: int) -> list | None:
    return sock.recv_multipart() if sock.poll(timeout_ms) else None


def _wait_event(monitor: zmq.Socket, event: int, timeout_s: float = 5.0) -> bool:
    from zmq.utils.monitor import recv_monitor_message

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if monitor.poll(100) and recv_monitor_message(monitor)["event"] == event:
            return True
    return False


@pytest.fixture
def limited():
    ctx = zmq.Context()
    server = ctx.socket(zmq.ROUTER)
    limit_socket(server, LIMIT, 1000)  # before bind: the listener copies the options
    monitor = server.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    port = server.bind_to_random_port("tcp://127.0.0.1")

    def dealer(ident: bytes) -> zmq.Socket:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, ident)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"tcp://127.0.0.1:{port}")
        return s

    yield server, monitor, dealer
    ctx.destroy(linger=0)


def test_limit_socket_options():
    ctx = zmq.Context()
    try:
        s = ctx.socket(zmq.ROUTER)
        limit_socket(s, 12345, 77)
        assert (s.getsockopt(zmq.MAXMSGSIZE), s.getsockopt(zmq.RCVHWM), s.getsockopt(zmq.SNDHWM)) == (12345, 77, 77)
    finally:
        ctx.destroy(linger=0)


def test_an_oversized_frame_is_dropped_and_its_sender_disconnected(limited):
    server, monitor, dealer = limited
    tx, rx = Codec(SECRET, W1), Codec(SECRET, "router")
    bad = dealer(W1.encode())
    bad.send_multipart(tx.encode({"t": "kvd"}, bytes(LIMIT + 1), to="router"))
    assert _wait_event(monitor, zmq.EVENT_DISCONNECTED)  # ZeroMQ closed that connection
    assert _recv(server, 300) is None  # ... and the message never surfaced, not even its first frames
    good = dealer(W2.encode())
    w2 = Codec(SECRET, W2)
    good.send_multipart(w2.encode({"t": "hb"}, to="router"))
    fr = _recv(server, 5000)
    assert fr is not None and rx.decode(fr[1:], sender=fr[0])[0]["_from"] == W2
    # a legitimate message whose largest frame is exactly the limit passes
    good.send_multipart(w2.encode({"t": "kvd"}, bytes(LIMIT), to="router"))
    fr = _recv(server, 5000)
    assert fr is not None and bytes(rx.decode(fr[1:], sender=fr[0])[1][0]) == bytes(LIMIT)


def test_the_limit_is_per_frame(limited):
    server, _, dealer = limited
    tx, rx = Codec(SECRET, W1), Codec(SECRET, "router")
    s = dealer(W1.encode())
    s.send_multipart(tx.encode({"t": "kvd"}, bytes(LIMIT), bytes(LIMIT), bytes(LIMIT), to="router"))
    fr = _recv(server, 5000)  # 3 x LIMIT bytes in all, each frame within the limit: delivered
    assert fr is not None and len(rx.decode(fr[1:], sender=fr[0])[1]) == 3


# ---- control-channel limit -----------------------------------------------------------------
@pytest.mark.parametrize("max_model_len", [1, 2048, 32768, 131072])
def test_control_message_limit_holds_the_largest_control_messages(max_model_len):
    limit = control_message_limit(max_model_len)
    assert limit <= (64 << 10) + 64 * max_model_len + 64 * 256  # bounded, linear in the context
    w, router = Codec(SECRET, W1), Codec(SECRET, "router")
    prompt = [2**32 - 1] * max_model_len  # the widest token ids msgpack writes
    params = {"max_tokens": max_model_len, "temperature": 0.7, "top_p": 0.9, "top_k": 50, "seed": 2**63 - 1,
              "stop_token_ids": [2**32 - 1] * 64, "ignore_eos": False}
    blocks = list(range(2**31, 2**31 + max_model_len // 16 + 1))
    gen = router.encode({"t": "gen", "rid": "123456789.12", "ids": prompt, "p": params, "kind": "prefill",
                         "dst": 1, "blocks": blocks}, to=W1)
    out = w.encode({"t": "out", "items": [["123456789.%d" % i, [2**32 - 1], True, "length"] for i in range(256)]
                    + [["987654321.0", prompt, True, "length"]]}, to="router")
    assert max(len(f) for f in gen + out) <= limit
