"""`--transport nccl`: K/V moves by torch.distributed point-to-point send/recv between the prompt
worker and the token worker (NCCL when the engines are on CUDA; gloo on CPU, the same code), and
only the signed control messages travel over ZeroMQ, as with tcp (`CollectiveTransport`).

- Each pair of workers gets its own two-rank process group, made on the first transfer between
  them (pairs.py): the token worker hosts a TCPStore whose address goes out in its `hello`
  (`region`, which the router forwards to the prompt worker in `gen`: `Target.where["region"]`).
- `put` posts a send of the layer's (or, serialized, the whole cache's) K/V on the pair's group
  and returns a small descriptor frame (pair, sequence number, shape, dtype) that rides in the
  announcing message (`kvl` / `kvd`), which goes over ZeroMQ as before: the messages of a pair
  keep their order, so the receiver posts its receives in the sender's order.
- `recv_all` (the token worker's loop) reads the messages; for each descriptor it posts the
  matching receive into a fresh tensor and holds the message, and the messages after it from the
  same sender, until the receive is done. Then it hands the message over with the received tensor
  as its data frame; the receiver (receiver.py) writes it into the reserved blocks as on tcp.
  A waiter thread per pair wakes the worker's loop when a receive completes (an empty frame to the
  transport's own inbound socket), so the loop never waits on a transfer's bytes. The one wait:
  a prompt worker's first transfer to a peer makes the pair inside `put` (milliseconds here; a
  peer's store that refuses fails at once, one that does not answer within 5 s fails the put).
- Failure: a peer that died closes its gloo connections (the pending operations fail at once); a
  stalled one fails them at the group's timeout; `drop_peer` (the router's `peer_down`) breaks its
  pairs at once. A failed receive breaks its pair: its `kvl` messages are dropped and its `kvd`
  goes on without data, so the receiver reports the transfer incomplete (`kv_fail`) and the router
  restarts the request; the next transfer makes a new pair.
- Refused (TransportUnavailable, one line): echo workers (no KV), `--kv-encryption on` (gloo and
  NCCL do not encrypt), and, at the first transfer, two workers on one GPU (NCCL cannot).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

import msgpack
import zmq

from ..curve import CurveKeys
from ..protocol import BadMessage, Codec
from .transports import Put, Target, TcpTransport, TransportError, TransportUnavailable

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch

    from .pairs import Link, PairHost

WAKE = b""  # a one-frame message from our own waker socket (a signed message has at least two)


class KvDesc(TypedDict):
    """The descriptor frame of a K/V message: its pair, sequence number there, shape and dtype."""

    p: str
    s: int
    shape: list[int]
    dtype: str


@dataclass(slots=True, eq=False)
class Held:
    """A message from a sender, held until its K/V is in (`state`: "wait" | "ok" | "fail")."""

    header: dict
    desc: KvDesc | None = None
    buf: torch.Tensor | None = None
    state: str = "ok"
    posted: bool = False
    why: str = ""
    since: float = field(default_factory=time.monotonic)


class CollectiveTransport(TcpTransport):
    """Control over ZeroMQ (TcpTransport), K/V over a torch.distributed pair group per peer."""

    name = "nccl"

    def __init__(self, ctx: zmq.Context, codec: Codec, host: str = "127.0.0.1", max_message: int = 1 << 30,
                 curve: CurveKeys | None = None, device: str | torch.device | None = None,
                 timeout_s: float = 30.0) -> None:
        import torch

        if device is None:
            raise TransportUnavailable("--transport nccl moves the engines' KV; echo workers have none: "
                                       "use --transport tcp")
        if curve is not None:
            raise TransportUnavailable("--transport nccl sends KV unencrypted (gloo/NCCL), but --kv-encryption "
                                       "is on: use --transport tcp, or --kv-encryption off on a trusted network")
        from .pairs import PairHost, gpu_uuid

        super().__init__(ctx, codec, host, max_message, curve)
        self.device = torch.device(device)
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        if self.backend == "gloo":
            logger.info("worker %s: --transport nccl on %s: KV moves over torch.distributed gloo",
                        codec.name.partition('.')[0].lstrip('w'), self.device.type)
        self.timeout_s, self.max_message = timeout_s, max_message
        self.host_addr = host
        self._waker = ctx.socket(zmq.DEALER)
        self._waker.setsockopt(zmq.LINGER, 0)
        self._waker.connect(self.address)
        self._wake_lock = threading.Lock()
        self._woken = False
        self.pairs: PairHost = PairHost(host, self.backend, self.device, timeout_s, self._wake)
        self.uuid = gpu_uuid(self.device)
        self.region = {"kind": "collective", "store": self.pairs.address, "backend": self.backend, "gpu": self.uuid}
        self.out: dict[tuple[int, str], Link] = {}      # (peer, its store) -> our sending link
        self.held: dict[str, deque[Held]] = {}          # sender's name -> its messages, in order
        self.failed = 0                                 # transfers whose K/V did not arrive

    def _wake(self) -> None:
        """From a waiter or join thread: make the worker's loop call recv_all (one wake on the
        socket at a time: `_woken` says one is there, unread)."""
        with self._wake_lock:
            if not self._woken:
                try:
                    self._waker.send(WAKE, flags=zmq.NOBLOCK)
                    self._woken = True
                except zmq.ZMQError:
                    pass  # closed: no loop to wake

    # ---- the sending side ---------------------------------------------------------------------
    def _link(self, target: Target) -> Link:
        from .pairs import connect

        region = (target.where or {}).get("region") or {}
        if region.get("kind") != "collective" or not isinstance(region.get("store"), str):
            raise TransportError("the token worker published no KV store (is it on --transport nccl?)")
        if region.get("backend") != self.backend:
            raise TransportError(f"the token worker moves KV over {region.get('backend')}, this worker over "
                                 f"{self.backend}: run every worker on the same kind of device")
        if self.uuid is not None and region.get("gpu") == self.uuid:
            raise TransportError(f"the token worker is on this worker's GPU ({self.uuid}); NCCL cannot join two "
                                 f"ranks on one GPU: use --transport local, or one GPU per worker")
        key = (target.peer, region["store"])
        link = self.out.get(key)
        if link is not None and link.broken:
            self.out.pop(key).close()
            link = None
        if link is None:
            try:
                link = connect(region["store"], self.codec.name, self.backend, self.device, self.host_addr,
                               self.timeout_s)
            except (OSError, RuntimeError, ValueError) as e:
                # the peer's store refused or timed out (OSError), torch.distributed's errors
                # (RuntimeError, its DistError kinds), a group that could not be made (ValueError)
                raise TransportError(f"cannot join a KV pair with worker {target.peer} at {region['store']}: "
                                     f"{type(e).__name__}: {str(e)[:200]}") from None
            self.out[key] = link
        return link

    def put(self, target: Target, layer: int | None, kv: torch.Tensor) -> Put:
        from .pairs import LinkBroken

        link = self._link(target)
        t = kv.detach().contiguous()  # the engine's fresh gather for this call (as tcp ships it, no copy)
        if self.backend == "gloo" and t.device.type != "cpu":
            t = t.cpu()
        try:
            seq = link.post(t)
        except LinkBroken as e:
            raise TransportError(f"the KV pair with worker {target.peer} broke: {e}") from None
        dtype = str(t.dtype).removeprefix("torch.")
        meta = None
        if layer is None:
            layers, _, tokens, kvh, hd = t.shape
            meta = {"num_layers": layers, "num_tokens": tokens, "num_kv_heads": kvh, "head_dim": hd, "dtype": dtype}
        return Put([msgpack.packb({"p": link.id, "s": seq, "shape": list(t.shape), "dtype": dtype})], meta=meta)

    # ---- the receiving side -------------------------------------------------------------------
    def recv_all(self) -> list[tuple[dict, list]]:
        while True:
            try:
                frames = self.inbound.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            if len(frames) == 2 and frames[1].bytes == WAKE:
                # cleared as the wake is read, not before reading: a wake sent while we read and
                # read here would otherwise leave the flag set with no wake on the socket, and
                # silence the next one (its receive then waited for an unrelated message)
                with self._wake_lock:
                    self._woken = False
                continue
            try:
                header, data = self.codec.decode(frames[1:])
            except BadMessage:
                continue  # counted by the codec
            self.held.setdefault(header.get("_from", ""), deque()).append(self._hold(header, data))
        return self._deliver()

    def _hold(self, header: dict, data: list) -> Held:
        if not data:
            return Held(header)
        try:
            d = msgpack.unpackb(bytes(data[0]))
            desc: KvDesc = {"p": str(d["p"]), "s": int(d["s"]), "shape": [int(x) for x in d["shape"]],
                            "dtype": str(d["dtype"])}
        except (ValueError, TypeError, KeyError, msgpack.UnpackException):
            return Held(header, state="fail", why="malformed KV descriptor")
        return Held(header, desc, state="wait")

    def _post(self, h: Held, sender: str) -> None:
        """Post the receive `h` waits for, once its pair is joined (or fail it)."""
        import torch

        from ..shm import DTYPES
        from .pairs import LinkBroken

        desc = h.desc
        assert desc is not None  # a message waits only on its descriptor (_hold)
        link = self.pairs.links.get(desc["p"])
        if link is None:  # the listener is still joining that pair: it wakes us when it has
            if time.monotonic() - h.since > self.timeout_s:
                h.state, h.why = "fail", f"KV pair {desc['p']} never joined"
            return
        dtype = DTYPES.get(desc["dtype"])
        numel = 1
        for s in desc["shape"]:
            numel *= s
        if link.sender != sender or dtype is None or numel * dtype.itemsize > self.max_message or numel < 0:
            h.state, h.why = "fail", "KV descriptor for another sender's pair, or of a bad size"
            link.breaks(h.why)  # its send will never be received: the pair is out of step
            return
        if link.broken:
            h.state, h.why = "fail", link.broken
            return
        h.buf = torch.empty(desc["shape"], dtype=dtype, device=self.device if self.backend == "nccl" else "cpu")
        h.posted = True

        def done(err: str | None) -> None:
            h.state, h.why = ("ok", "") if err is None else ("fail", err)

        try:
            seq = link.post(h.buf, done)
        except LinkBroken as e:
            h.state, h.why = "fail", str(e)
            return
        if seq != desc["s"]:  # a message of this pair was lost: nothing matches any more
            link.breaks(f"KV message {seq} of pair {link.id} missing (got {desc['s']})")

    def _deliver(self) -> list[tuple[dict, list]]:
        out = []
        for sender, q in list(self.held.items()):
            for h in q:  # post in order every receive whose pair is ready
                if h.state == "wait" and not h.posted:
                    self._post(h, sender)
            while q and q[0].state != "wait":
                h = q.popleft()
                if h.state == "ok":
                    out.append((h.header, [h.buf] if h.desc is not None else []))
                    continue
                self.failed += 1
                if h.header.get("t") != "kvl":  # kvd goes on without its K/V: the transfer fails now
                    out.append((h.header, []))
            if not q:
                del self.held[sender]
        return out

    # ---- peers ----------------------------------------------------------------------------------
    def drop_peer(self, peer: int) -> None:
        super().drop_peer(peer)
        for key in [k for k in self.out if k[0] == peer]:
            self.out.pop(key).close()
        prefix = f"w{peer}."
        with self.pairs.lock:
            gone = [k for k, link in self.pairs.links.items() if link.sender.startswith(prefix)]
            links = [self.pairs.links.pop(k) for k in gone]
        for link in links:
            link.close()
        for sender, q in self.held.items():
            if sender.startswith(prefix):
                for h in q:
                    if h.state == "wait":
                        h.state, h.why = "fail", "the prompt worker is down"

    def close(self) -> None:
        for key in list(self.out):
            self.out.pop(key).close()
        self.pairs.close()
        with self._wake_lock:  # no thread wakes us any more
            self._woken = True
            self._waker.close(linger=0)
        super().close()
