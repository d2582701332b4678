"""Messages between the router and the workers, and between workers (KV), over ZeroMQ.

Wire format
-----------
Every message is a multipart ZeroMQ message `[mac, head, *data]`:

* `head`: a msgpack map, the caller's header (its "t" names the message type) plus four
  envelope fields that encode() adds and decode() strips (a header must not use these keys):

  - "_from": str, the sender's name (the Codec's `name`),
  - "_to":   str, the destination's name,
  - "_seq":  int, the sender Codec's counter: strictly increasing (it starts at the wall clock in
    ns, so that a restarted endpoint with the same name and secret still counts upwards),
  - "_data": 16 bytes, keyed BLAKE2b over the data frames, each prefixed with its length
    (8 bytes, little endian); nil when the message has no data frames.

* `mac`: 16 bytes, keyed BLAKE2b of `head` alone. The data frames are bound to it through "_data".
* `data`: raw byte frames (KV tensors), sent as given (no copy).

The three BLAKE2b uses (MAC, data digest, worker identity) are keyed with the cluster secret and
domain-separated by BLAKE2b's personalization parameter.

A receiver checks, cheapest first: the frame count and the size of `head` (at most `max_head`
bytes), the MAC of `head` (so a forged message costs hashing at most `max_head` bytes, never its
data frames), the head's format, "_to" == its own name, "_from" == the routing identity it came
from (where the caller knows it), "_seq" > the last one accepted from "_from" (replay and
reordering protection), and last the data digest. A message that fails is dropped, raises
BadMessage and is counted (`Codec.rejected`, and per reason in `Codec.rejected_by`). So a peer
without the secret can neither submit work to a worker, nor inject KV into one, nor pose as a
worker to the router; and a signed message cannot be replayed, nor redirected to another endpoint.
Every pair of endpoints must use one ordered channel (one ZeroMQ connection) and one thread per
Codec, or a legitimate message overtaken by a later one is rejected as a replay.

Worker identities
-----------------
`worker_identity(secret, id, generation)` is the ZeroMQ routing identity of one incarnation of a
worker, e.g. b"w3.2.9f1c0a7e5d2b4c68": readable prefix "w<id>.<generation>." and 16 hex digits of
keyed BLAKE2b. Router and worker compute it independently from the secret (no command line shows
it), and a local process without the secret cannot squat on it. The worker's Codec name is
`worker_identity(...).decode()`; the router's is "router".

API for the callers
-------------------
    codec = Codec(secret, name)            # name: "router", or the worker's identity (str)
    frames = codec.encode(header, *data, to="w3.2.9f1c...")   # [mac, head, *data]
    header, data = codec.decode(frames, sender=None)          # frames: [mac, head, *data]

decode() takes frames as zmq.Frame, bytes or memoryview, without the routing-identity frame a
ROUTER socket prepends; the router passes that identity as `sender` (str, bytes or zmq.Frame).
It returns the header without the envelope fields plus "_from" (the sender's name), and the data
frames as memoryviews (not copied). `limit_socket` and `control_message_limit` bound what a
socket accepts (ZMQ_MAXMSGSIZE, per frame) and how many messages it queues.

The secret is made by the router at start (32 random bytes) and handed to each worker in the
environment variable `SPLITSERVE_CLUSTER_SECRET` (hex), never on a command line.

Signed, not encrypted: this module makes messages authentic, not secret. With `--kv-encryption`
on (the default when the workers do not bind a loopback address) the sockets also encrypt every
frame with ZeroMQ CURVE, its keys derived from the same secret (curve.py); the frames above are
then the plaintext inside CURVE's boxes.

Message types
-------------
What a header may hold, kind by kind: the typed classes of messages/; every message, its direction,
fields and meaning: the message table of docs/architecture.md (Messages).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import secrets
import time
from typing import Any

import msgpack
import zmq

SECRET_ENV = "SPLITSERVE_CLUSTER_SECRET"
MAC_BYTES = 16
ROUTER_NAME = "router"
ENVELOPE = frozenset(("_from", "_to", "_seq", "_data"))
_LEN = 8  # bytes of each data frame's length prefix in the data digest


class BadMessage(Exception):
    """A message that failed authentication or decoding; it has been dropped. `reason` is one of
    "format", "size", "mac", "destination", "sender", "replay", "digest"."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def secret_from_env() -> bytes:
    value = os.environ.get(SECRET_ENV)
    if not value:
        raise SystemExit(f"worker: {SECRET_ENV} is not set; workers are started by `splitserve serve`")
    return bytes.fromhex(value)


def _hasher(secret: bytes, person: bytes, size: int = MAC_BYTES) -> Any:
    if len(secret) < 16:
        raise ValueError("the cluster secret must be at least 16 bytes")
    return hashlib.blake2b(key=secret[:64], digest_size=size, person=person)


def worker_identity(secret: bytes, worker_id: int, generation: int) -> bytes:
    """The ZeroMQ routing identity of incarnation `generation` of worker `worker_id`:
    b"w<id>.<gen>." + 16 hex digits of BLAKE2b keyed with the secret over (id, gen)."""
    if worker_id < 0 or generation < 0:
        raise ValueError("worker id and generation must be >= 0")
    h = _hasher(secret, b"splitserve-id", 8)
    h.update(worker_id.to_bytes(8, "little") + generation.to_bytes(8, "little"))
    return b"w%d.%d.%s" % (worker_id, generation, h.hexdigest().encode())


def _buf(f: Any) -> Any:
    return f.buffer if isinstance(f, zmq.Frame) else f


class Codec:
    """Signs messages from, and verifies messages to, the endpoint `name` under the cluster
    secret. One thread per Codec. max_head: largest head frame accepted, checked before hashing
    it (4 MiB holds a prompt of ~800k token ids; for longer contexts pass
    control_message_limit(max_model_len)); max_data_frames: most data frames in a message;
    max_senders: senders whose last counter is remembered (least recently heard from forgotten
    first: a message of a forgotten sender could be replayed to this endpoint once)."""

    def __init__(self, secret: bytes, name: str, *, max_head: int = 4 << 20, max_data_frames: int = 64,
                 max_senders: int = 4096) -> None:
        self.name = name
        self.max_head, self.max_data_frames, self.max_senders = max_head, max_data_frames, max_senders
        self._mac0 = _hasher(secret, b"splitserve-mac")
        self._data0 = _hasher(secret, b"splitserve-data")
        self._seq = itertools.count(time.time_ns())
        self._last: dict[str, int] = {}  # sender -> last counter accepted, least recent first
        self.rejected = 0
        self.rejected_by: dict[str, int] = {}

    def _digest(self, data: tuple | list) -> bytes:
        h = self._data0.copy()
        for f in data:
            mv = memoryview(f)
            if mv.ndim != 1 or mv.itemsize != 1:
                mv = mv.cast("B")  # numpy arrays of any dtype: sign their bytes
            h.update(mv.nbytes.to_bytes(_LEN, "little"))  # frame boundaries are part of what is signed
            h.update(mv)
        return h.digest()

    def encode(self, header: dict, *data: Any, to: str) -> list:
        """The frames `[mac, head, *data]` of a message to the endpoint named `to`."""
        if not ENVELOPE.isdisjoint(header):
            raise ValueError(f"header keys {sorted(ENVELOPE & header.keys())} are reserved")
        head = msgpack.packb({**header, "_from": self.name, "_to": to, "_seq": next(self._seq),
                              "_data": self._digest(data) if data else None}, use_bin_type=True)
        h = self._mac0.copy()
        h.update(head)
        return [h.digest(), head, *data]

    def _reject(self, reason: str, detail: str) -> BadMessage:
        self.rejected += 1
        self.rejected_by[reason] = self.rejected_by.get(reason, 0) + 1
        return BadMessage(reason, detail)

    def decode(self, frames: list, sender: str | bytes | zmq.Frame | None = None) -> tuple[dict, list]:
        """(header with "_from", data frames) of a verified message to this endpoint; BadMessage
        otherwise. `sender`: the routing identity the message came in on, where known."""
        if len(frames) < 2:
            raise self._reject("format", f"{len(frames)} frames")
        if len(frames) - 2 > self.max_data_frames:
            raise self._reject("size", f"{len(frames) - 2} data frames")
        head = _buf(frames[1])
        if len(head) > self.max_head:
            raise self._reject("size", f"a head of {len(head)} bytes")
        h = self._mac0.copy()
        h.update(head)
        mac = _buf(frames[0])
        if len(mac) != MAC_BYTES or not hmac.compare_digest(h.digest(), mac):
            raise self._reject("mac", "the peer does not hold the cluster secret")
        try:
            header = msgpack.unpackb(head, raw=False)
            src, dst, seq, digest = header.pop("_from"), header.pop("_to"), header.pop("_seq"), header.pop("_data")
        except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException) as e:
            # a counted rejection: msgpack's errors are ValueErrors (FormatError, StackError,
            # ExtraData, bad UTF-8); a head that is no map, or lacks a field, raises the others
            raise self._reject("format", f"undecodable head: {e!r}") from None
        if type(src) is not str or type(seq) is not int or "t" not in header or \
                (digest is not None and type(digest) is not bytes):
            raise self._reject("format", "a head without type, sender, counter or digest")
        if dst != self.name:
            raise self._reject("destination", f"a message for {dst!r}")
        if sender is not None:
            if not isinstance(sender, str):
                sender = bytes(_buf(sender)).decode("utf-8", "replace")
            if src != sender:
                raise self._reject("sender", f"{src!r} on the connection of {sender!r}")
        last = self._last.get(src)
        if last is not None and seq <= last:
            raise self._reject("replay", f"counter {seq} from {src!r} after {last}")
        data = [_buf(f) for f in frames[2:]]
        if digest is None:
            if data:
                raise self._reject("digest", "data frames in a message signed without any")
        elif not data or not hmac.compare_digest(self._digest(data), digest):
            raise self._reject("digest", "data frames altered")
        if last is not None:
            del self._last[src]  # re-inserted last: the most recently heard from
        elif len(self._last) >= self.max_senders:
            del self._last[next(iter(self._last))]
        self._last[src] = seq
        header["_from"] = src
        return header, data


def limit_socket(sock: zmq.Socket, max_message_bytes: int, hwm: int) -> None:
    """Bound what `sock` accepts and queues. Call it before bind/connect: libzmq copies a socket's
    options into each listener and connection when they are made.

    ZMQ_MAXMSGSIZE = max_message_bytes applies to each frame (message part) separately: libzmq's
    decoder compares every frame's announced length with it, before allocating, and on a larger
    one closes that connection (a connecting peer reconnects; the partial multipart message is
    dropped, never delivered). A multipart message of several frames each within the limit passes
    whatever its total, so decode() also bounds the number of frames (Codec.max_data_frames).
    A frame of exactly max_message_bytes passes.

    RCVHWM and SNDHWM = hwm: messages (whole multipart messages) queued per connection before
    ZeroMQ drops (ROUTER receiving, ROUTER sending) or blocks/refuses with EAGAIN (DEALER sending).
    0 means no limit. What a peer can make this socket hold is then about
    hwm x max_data_frames x max_message_bytes per connection."""
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.SNDHWM, hwm)


CONTROL_BASE_BYTES = 64 << 10
BUNDLE_MAX = 64  # messages a worker sends to the router in one ZeroMQ message at most (its outbox)


def control_message_limit(max_model_len: int, max_num_seqs: int = 256) -> int:
    """The largest frame a control socket (router <-> worker) should accept, for ZMQ_MAXMSGSIZE:
    64 KiB + 40 bytes per token of `max_model_len` + 64 bytes per sequence of a worker batch.

    Why this bounds every control message: msgpack writes a token id (< 2**32) in at most 5 bytes.
    A message holds at most one prompt (gen, expect: <= 5 x max_model_len bytes) and block-id
    lists proportional to it (reserved, gen prefill: a block holds several tokens), so 10 bytes per
    token covers a message's token lists, and the factor 4 leaves room for what a request carries
    with it (stop token ids, logit bias, both bounded by the request schema) and for an "out"
    message that returns a whole completion (<= max_model_len tokens) in one step. An "out"
    message holds one item per sequence of the worker's batch (<= max_num_seqs): request id,
    flags and finish reason are < 64 bytes. The 64 KiB covers the fixed fields (sampling
    parameters, error texts, a KV region handle, the envelope). The echo benchmark engine returns
    whole completions of every queued request in one step, which this does not bound.
    """
    return CONTROL_BASE_BYTES + 40 * max_model_len + 64 * max_num_seqs


def boot_id() -> str | None:
    """This host's boot id (Linux: /proc/sys/kernel/random/boot_id), or None. Two processes with the
    same one read the same monotonic clock through time.perf_counter(), so the router can place a
    worker's `step` at the moment the worker formed it (`Step.at`), not when the report was read."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None
