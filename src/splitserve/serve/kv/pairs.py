"""Two-rank torch.distributed process groups between a prompt worker and a token worker, for
`--transport nccl` (collective.py): one group per (sender, receiver) pair, made on first use, with
no global default group (no `init_process_group`), so any number of pairs live in one process.

- The receiving side (`PairHost`) runs a TCPStore on its KV address's host, published in its
  `hello` (the transport's `region`), and a listener thread that joins each pair a sender asks
  for. A sender (`connect`) takes the next pair number from the store (`add`), writes who it is
  under `pair/<n>`, and both sides build the group under the store prefix `p<n>/` (sender rank
  0, receiver rank 1), each from its own thread, so neither waits on the other's worker loop.
- Backend: NCCL on CUDA (`ProcessGroupNCCL`, connected eagerly on the worker's device, with a
  one-element warm-up send/recv so that the first real send never waits for the peer's loop),
  gloo on CPU (bound to the KV address's host). NCCL cannot put two ranks on one GPU: the
  receiver publishes its GPU's UUID and `connect` refuses to pair with it.
- `Link` is one side of a pair: a sequence number per send/recv (gloo matches them by tag; NCCL
  in order) and a waiter thread that waits on each operation (gloo's wait blocks and cannot be
  polled: a timed-out wait closes the pair) and calls back when it is done or failed. Any failure
  breaks the link for good (`broken`): its transfers fail and the next one makes a new pair.
  A wait is bounded by the group's timeout; a peer that dies closes its gloo connections at once.
  NCCL links are aborted on failure and past their deadline (not yet run on GPUs).
- Trust: the store listens on the KV address's host only, and neither it nor gloo/NCCL
  authenticates or encrypts. A pair's receives are posted only for descriptors in the signed
  messages of the worker that wrote the pair's record, so a stranger reaching the store can
  stall new pairs (a denial of service) but not put K/V into a request; on a shared network,
  prefer tcp with --kv-encryption on (config.py refuses nccl with encryption on).
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import msgpack
import torch

logger = logging.getLogger(__name__)

PAIRS = "splitserve/pairs"
POLL_S = 0.02  # how often the receiving side looks for a new pair
CONNECT_S = 5.0  # the most a sender waits to reach a receiver's store


class LinkBroken(Exception):
    """The pair cannot carry K/V any more (its peer died, it timed out or was dropped)."""


def gpu_uuid(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    return str(torch.cuda.get_device_properties(device).uuid)


def new_group(store, rank: int, backend: str, device: torch.device, host: str, timeout: timedelta):
    """A two-rank process group on `store` (already prefixed), connected, warmed up."""
    import torch.distributed as dist

    pg: dist.ProcessGroupGloo | dist.ProcessGroupNCCL
    if backend == "gloo":
        # the options that take devices: private, so not in torch's stubs
        opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        opts._timeout = timeout
        pg = dist.ProcessGroupGloo(store, rank, 2, opts)
        one = torch.zeros(1)
    else:
        opts = dist.ProcessGroupNCCL.Options()
        # later than our own deadline (Link aborts the pair then): past its timeout, NCCL's
        # watchdog would take the whole worker down
        opts._timeout = timeout + timedelta(seconds=30)
        with torch.cuda.device(device):
            pg = dist.ProcessGroupNCCL(store, rank, 2, opts)
            pg.eager_connect_single_device(device)
            one = torch.zeros(1, device=device)
    # the p2p path's first operation connects the pair: do it now, from both sides at once (a
    # c10d Backend has send/recv at runtime; torch's stubs declare them on ProcessGroup only)
    work = pg.send([one], 1, 0) if rank == 0 else pg.recv([one], 0, 0)  # type: ignore[union-attr]
    wait(work, backend, time.monotonic() + timeout.total_seconds())
    return pg


def wait(work, backend: str, deadline: float) -> None:
    """Block until `work` is done; raises on failure (and TimeoutError past `deadline`, NCCL)."""
    if backend == "gloo":
        work.wait()  # bounded by the group's timeout
        return
    while not work.is_completed():
        if time.monotonic() > deadline:
            raise TimeoutError("NCCL operation past its deadline")
        time.sleep(0.0002)
    work.wait()  # raises the operation's error, if any


@dataclass(eq=False)
class Link:
    """One side of a pair: `rank` 0 sends, 1 receives. `on_event` is called (from a waiter
    thread) after each operation completes or fails."""

    id: str
    pg: Any
    rank: int
    backend: str
    timeout_s: float
    sender: str = ""  # the sending worker's codec name (receiving side: who may announce on it)
    on_event: Callable[[], None] = lambda: None
    broken: str | None = None
    seq: int = 0
    jobs: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    _thread: threading.Thread | None = None

    def post(self, t: torch.Tensor, done: Callable[[str | None], None] | None = None) -> int:
        """Send (rank 0) or receive into (rank 1) `t`; its sequence number. `done(error)` is
        called from the waiter thread when it finished (error None) or failed. LinkBroken if it
        cannot be posted."""
        self.seq += 1
        if self.broken is not None:
            raise LinkBroken(self.broken)
        try:
            work = self.pg.send([t], 1, self.seq) if self.rank == 0 else self.pg.recv([t], 0, self.seq)
        except (RuntimeError, ValueError) as e:  # torch.distributed's errors: the pair is closed (its peer died)
            self.breaks(f"{type(e).__name__}: {str(e)[:200]}")
            raise LinkBroken(self.broken) from None
        if self._thread is None:
            self._thread = threading.Thread(target=self._waiter, daemon=True, name=f"kv-link-{self.id}")
            self._thread.start()
        self.jobs.put((work, t, done, time.monotonic() + self.timeout_s))
        return self.seq

    def _waiter(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            work, _t, done, deadline = job
            err = self.broken
            if err is None:
                try:
                    wait(work, self.backend, deadline)
                except (RuntimeError, ValueError, TimeoutError) as e:  # its peer died, it timed out or was aborted
                    err = f"{type(e).__name__}: {str(e)[:200]}"
                    self.breaks(err)
            if done is not None:
                done(err)
            self.on_event()

    def breaks(self, why: str) -> None:
        """Break the link for good (idempotent): its pending operations fail."""
        if self.broken is None:
            self.broken = why
            if self.backend == "nccl":
                try:
                    self.pg.abort()  # unsticks its kernels; gloo's abort does not wake a wait
                except (RuntimeError, ValueError) as e:  # aborted or torn down already
                    logger.debug("KV pair %s: abort failed: %r", self.id, e)

    def close(self) -> None:
        self.breaks("closed")
        self.jobs.put(None)
        if self._thread is not None:  # a thread left in a C++ wait at exit aborts the process
            self._thread.join(0.5)


class PairHost:
    """The receiving side: the store and the listener that joins pairs (see the module docstring).
    `address` is "host:port"; joined links land in `links` (by id) and `on_event` is called."""

    def __init__(self, host: str, backend: str, device: torch.device, timeout_s: float,
                 on_event: Callable[[], None]) -> None:
        from torch.distributed import TCPStore

        self.host, self.backend, self.device, self.timeout_s = host, backend, device, timeout_s
        self.on_event = on_event
        # the store listens on `host` only (given a port, TCPStore would listen on every interface)
        family, kind, proto, _, addr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.bind(addr)
        sock.listen(128)
        port = sock.getsockname()[1]
        self.store = TCPStore(host, port, is_master=True, wait_for_workers=False, master_listen_fd=sock.detach(),
                              timeout=timedelta(seconds=timeout_s))
        self.address = f"{host}:{port}"
        self.links: dict[str, Link] = {}
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._listen, daemon=True, name="kv-pair-listener").start()

    def _listen(self) -> None:
        """Poll the store for the next pair (check, not wait: a store wait that times out logs a
        warning each time); every POLL_S while idle, so a pair's first transfer waits that long at most."""
        from torch.distributed import TCPStore

        client = TCPStore(self.host, self.store.port, is_master=False, timeout=timedelta(seconds=self.timeout_s))
        n, missing_since = 1, None
        while not self.closed:
            try:
                if not client.check([f"pair/{n}"]):
                    # a sender that took number n and died before writing it: skip n after a while
                    if client.add(PAIRS, 0) > n:
                        missing_since = missing_since or time.monotonic()
                        if time.monotonic() - missing_since > 5.0:
                            n, missing_since = n + 1, None
                    time.sleep(POLL_S)
                    continue
                raw = client.get(f"pair/{n}")
            except (RuntimeError, OSError) as e:  # torch's store errors: the store is gone, we are closing
                logger.debug("KV pair listener stops: %r", e)
                return
            try:
                rec = msgpack.unpackb(raw)
                rec = rec if isinstance(rec, dict) else {}
            except (ValueError, TypeError, msgpack.UnpackException):
                rec = {}  # not a sender of ours: it joins nothing that a signed message names
            if rec:
                threading.Thread(target=self._join, args=(n, rec), daemon=True, name=f"kv-pair-join-{n}").start()
            n, missing_since = n + 1, None

    def _join(self, n: int, rec: dict) -> None:
        from torch.distributed import PrefixStore

        try:
            pg = new_group(PrefixStore(f"p{n}/", self.store), 1, self.backend, self.device, self.host,
                           timedelta(seconds=self.timeout_s))
        except (RuntimeError, ValueError, TimeoutError) as e:
            logger.debug("KV pair %d: not joined: %r", n, e)
            return  # the sender gave up (or died): its transfers fail on its side
        link = Link(str(n), pg, 1, self.backend, self.timeout_s, sender=str(rec.get("from", "")),
                    on_event=self.on_event)
        with self.lock:
            if self.closed:
                link.close()
                return
            self.links[link.id] = link
        self.on_event()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            links, self.links = list(self.links.values()), {}
        for link in links:
            link.close()


def connect(address: str, me: str, backend: str, device: torch.device, host: str, timeout_s: float) -> Link:
    """The sending side: join a new pair with the receiver whose store is at `address`. Blocks
    while the receiver's listener joins (milliseconds; bounded by `timeout_s`). Raises on failure."""
    from torch.distributed import PrefixStore, TCPStore

    peer_host, _, port = address.rpartition(":")
    socket.create_connection((peer_host, int(port)), timeout=CONNECT_S).close()  # refused: fail now, not retry
    store = TCPStore(peer_host, int(port), is_master=False, timeout=timedelta(seconds=min(timeout_s, CONNECT_S)))
    n = store.add(PAIRS, 1)
    store.set(f"pair/{n}", msgpack.packb({"from": me}))
    pg = new_group(PrefixStore(f"p{n}/", store), 0, backend, device, host, timedelta(seconds=timeout_s))
    return Link(str(n), pg, 0, backend, timeout_s)
