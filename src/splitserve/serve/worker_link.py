"""A worker's channel to the router: its DEALER socket (identity from the codec, size limit, CURVE),
the outbox, and the control messages read from it, checked.

Messages to the router wait in the outbox and go together, one ZeroMQ message of signed (mac,
head) pairs, when the worker calls `post` (before each engine step runs and at the end of its
loop; docs/architecture.md, Messages), or at once when the outbox holds BUNDLE_MAX of them. A
signed control message that is no valid message is dropped with its reason on stderr and counted
(`malformed`, in the worker's heartbeat)."""

from __future__ import annotations

import logging
import time
from typing import Iterator

import zmq

from .curve import CurveKeys
from .messages import TO_WORKER, MalformedMessage, Message, decode, encode
from .protocol import ROUTER_NAME as ROUTER
from .protocol import BUNDLE_MAX, BadMessage, Codec, limit_socket

logger = logging.getLogger(__name__)


class RouterLink:
    """The control socket of worker `wid`, connected to the router at `address`; messages of at
    most `limit` bytes either way."""

    def __init__(self, ctx: zmq.Context, codec: Codec, address: str, limit: int, wid: int,
                 curve: CurveKeys | None = None) -> None:
        self.codec, self.wid = codec, wid
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, codec.name.encode())
        self.sock.setsockopt(zmq.LINGER, 0)
        limit_socket(self.sock, limit, hwm=100_000)
        if curve is not None:
            curve.client(self.sock)
        self.sock.connect(address)
        self.outbox: list = []   # signed frames for the router, not sent yet
        self.malformed = 0       # signed router messages that were no valid message (a bug, or versions apart)
        self.last_heard = time.monotonic()  # when the router's last signed message came in

    def send(self, msg: Message) -> None:
        """Sign `msg` into the outbox (post() sends it)."""
        self.outbox += self.codec.encode(encode(msg), to=ROUTER)
        if len(self.outbox) >= 2 * BUNDLE_MAX:
            self.post()

    def post(self) -> None:
        """Send what the outbox holds, in order, as one message of (mac, head) pairs."""
        if self.outbox:
            self.sock.send_multipart(self.outbox, copy=False)
            self.outbox = []

    def receive(self) -> Iterator[Message]:
        """The control messages waiting on the socket, in order, each checked (for TO_WORKER);
        those that fail the signature or the check are dropped."""
        while True:
            try:
                frames = self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                h, _ = self.codec.decode(frames, sender=ROUTER)
            except BadMessage:
                continue
            self.last_heard = time.monotonic()
            try:
                msg = decode(h, TO_WORKER)
            except MalformedMessage as e:
                self.malformed += 1
                logger.warning("worker %s: dropped a malformed message: %s", self.wid, e.reason)
                continue
            yield msg

    def close(self) -> None:
        self.sock.close(linger=0)
