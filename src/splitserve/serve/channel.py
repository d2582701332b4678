"""The router's end of the control channel: one ZeroMQ ROUTER socket that every worker connects
to. Frames are signed and addressed (protocol.py: a worker's identity is derived from the
cluster secret, so nobody else can take it), headers are typed (messages/), and the socket
refuses frames larger than a control message can be (protocol.control_message_limit). A worker
sends its messages in bundles (worker.py's outbox): one ZeroMQ message of (mac, head) pairs,
each pair a signed message of its own, handled in order. With `curve` (curve.py) the socket is a
CURVE server: every frame is encrypted on the wire, and a peer without the cluster's key cannot
connect at all.

It runs on the front end's event loop. ZeroMQ's file descriptor is edge-triggered: it fires when
the socket's state changes, and any send or receive can consume that change. So the reader
drains until nothing is left (a bounded number at a time, then it lets the HTTP side run and
comes back), every send schedules another drain, and the router's monitor drains too.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Optional

import zmq

from .curve import CurveKeys
from .messages import TO_ROUTER, MalformedMessage, Message, decode, encode
from .protocol import BUNDLE_MAX, BadMessage, Codec, limit_socket
from .supervisor import WorkerInfo

logger = logging.getLogger(__name__)

Lookup = Callable[[bytes], Optional[WorkerInfo]]
Handler = Callable[[WorkerInfo, Message], None]


class RouterChannel:
    def __init__(self, codec: Codec, curve: CurveKeys | None = None) -> None:
        """curve: the cluster's CURVE keys when its sockets are encrypted."""
        self.codec, self.curve = codec, curve
        self.lookup: Lookup = lambda ident: None
        self.on_message: Handler = lambda w, msg: None
        self.ctx: zmq.Context | None = None
        self.sock: zmq.Socket | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.address = ""
        self.strangers = 0   # frames from identities of no current worker (dropped unread)
        self.malformed = 0   # signed messages whose header is no valid message
        self.oversized = 0   # bundles of more than BUNDLE_MAX messages (dropped unread)
        self._scheduled = False

    def open(self, host: str, max_message: int, lookup: Lookup, on_message: Handler) -> str:
        """Bind on `host` (a random port); the address workers connect to. lookup(identity): the
        worker of a current identity (None: a stale generation or a stranger); on_message(worker,
        message): a verified, typed message from it."""
        self.lookup, self.on_message = lookup, on_message
        self.loop = asyncio.get_running_loop()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.codec.max_head = max_message
        limit_socket(self.sock, max_message, hwm=100_000)
        if self.curve is not None:
            self.curve.server(self.sock)
        port = self.sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self.loop.add_reader(self.sock.fileno(), self.kick)
        return self.address

    def close(self) -> None:
        if self.sock is not None:
            if self.loop is not None:  # set with the socket, in open
                self.loop.remove_reader(self.sock.fileno())
            self.sock.close(linger=0)
            self.sock = None
        if self.ctx is not None:
            self.ctx.destroy(linger=0)
            self.ctx = None

    @property
    def rejected(self) -> int:
        return self.codec.rejected + self.strangers + self.malformed + self.oversized

    def send(self, w: WorkerInfo, msg: Message) -> None:
        if self.sock is None:
            return
        try:
            self.sock.send_multipart([w.ident, *self.codec.encode(encode(msg), to=w.ident.decode())],
                                     flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # an unroutable (dead) worker: the supervisor notices, its requests are restarted
        self.kick()

    def kick(self) -> None:
        if not self._scheduled and self.loop is not None:
            self._scheduled = True
            self.loop.call_soon(self.drain)

    def drain(self, limit: int = 2000) -> bool:
        """Handle up to `limit` queued messages; True if none are left."""
        self._scheduled = False
        sock = self.sock
        if sock is None or sock.closed:
            return True
        for _ in range(limit):
            try:
                fr = sock.recv_multipart(flags=zmq.NOBLOCK)  # bytes: cheaper than Frames for small messages
            except zmq.Again:
                return True
            w = self.lookup(fr[0])
            if w is None:
                self.strangers += 1
                continue
            if len(fr) > 1 + 2 * BUNDLE_MAX:
                self.oversized += 1
                continue
            sender = fr[0].decode()
            for i in range(1, len(fr), 2):  # a worker's outbox: (mac, head) pairs, each signed
                try:
                    h, _ = self.codec.decode(fr[i:i + 2], sender=sender)
                    msg = decode(h, TO_ROUTER)
                except BadMessage:
                    continue  # counted by the codec
                except MalformedMessage as e:
                    self.malformed += 1
                    logger.warning("router: worker %d sent a malformed message: %s", w.id, e.reason)
                    continue
                try:
                    self.on_message(w, msg)
                except Exception as e:  # a bug must not kill the router (its traceback: at debug level)
                    logger.error("router: error handling %s from worker %d: %r", msg.T, w.id, e,
                                 exc_info=logger.isEnabledFor(logging.DEBUG))
        self.kick()
        return False

    def drain_all(self) -> None:
        while not self.drain(limit=10_000):
            pass
