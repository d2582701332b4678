"""Messages between the router and the workers, and between workers (KV), over ZeroMQ.

Every message is a multipart ZeroMQ message `[mac, header, *data]`: `header` is a msgpack map
whose "t" names the message type, `data` are raw byte frames (KV tensors), and `mac` is a keyed
BLAKE2b digest (16 bytes) of the header and every data frame under the cluster's shared secret.
A receiver verifies the MAC of every message before it looks at the header; a message that does
not verify is dropped and counted (`Codec.rejected`). So a peer without the secret can neither
submit work to a worker, nor inject KV into one, nor pose as a worker to the router.

The secret is made by the router at start (32 random bytes) and handed to each worker in the
environment variable `SPLITSERVE_CLUSTER_SECRET` (hex), never on a command line.

Router -> worker: gen (run a request: "full" on this worker, or "prefill" and ship the KV to a
peer), expect (reserve KV blocks for an incoming transfer), cancel (drop a reservation), abort,
peer_down, stop. Worker -> router: hello, out (tokens of one engine step), reserved, kv_in (a
transfer landed; its bytes and times), kv_fail, err, hb (heartbeat with KV block counts).
Worker -> worker (KV transport): kvs (a step of the prompt starts; the receiver's timeout
restarts), kvl (one layer's KV, or with --transport local the word that layer i has been written
into the receiver's blocks), kvd (the transfer is complete; with the whole KV in serialized TCP
mode), kvx (local transport: the writer drops a transfer and will not write into its blocks
again). With --transport local, hello carries the worker's KV region
handle, reserved the reserved block ids, and gen (prefill) both of the token worker's.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

import msgpack

SECRET_ENV = "SPLITSERVE_CLUSTER_SECRET"
MAC_BYTES = 16


class BadMessage(Exception):
    """A message that failed authentication or decoding; it has been dropped."""


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def secret_from_env() -> bytes:
    value = os.environ.get(SECRET_ENV)
    if not value:
        raise SystemExit(f"worker: {SECRET_ENV} is not set; workers are started by `splitserve serve`")
    return bytes.fromhex(value)


class Codec:
    """Signs and verifies messages under one shared secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the cluster secret must be at least 16 bytes")
        self._key = secret[:64]
        self.rejected = 0

    def _mac(self, frames) -> bytes:
        h = hashlib.blake2b(key=self._key, digest_size=MAC_BYTES)
        for f in frames:
            mv = memoryview(f)
            if mv.ndim != 1 or mv.itemsize != 1:
                mv = mv.cast("B")  # numpy arrays: sign their bytes
            h.update(mv.nbytes.to_bytes(8, "little"))  # frame boundaries are part of what is signed
            h.update(mv)
        return h.digest()

    def encode(self, header: dict, *data) -> list:
        head = msgpack.packb(header, use_bin_type=True)
        frames = [head, *data]
        return [self._mac(frames), *frames]

    def decode(self, frames: list) -> tuple[dict, list]:
        """(header, data frames) of a verified message; BadMessage otherwise."""
        if len(frames) < 2:
            self.rejected += 1
            raise BadMessage("short message")
        mac, body = frames[0], frames[1:]
        body = [f.buffer if hasattr(f, "buffer") else f for f in body]
        mac = bytes(mac.buffer if hasattr(mac, "buffer") else mac)
        if not hmac.compare_digest(mac, self._mac(body)):
            self.rejected += 1
            raise BadMessage("bad MAC: the peer does not hold the cluster secret")
        try:
            header = msgpack.unpackb(body[0], raw=False)
        except Exception as e:
            self.rejected += 1
            raise BadMessage(f"undecodable header: {e}") from None
        if not isinstance(header, dict) or "t" not in header:
            self.rejected += 1
            raise BadMessage("header without a type")
        return header, body[1:]
