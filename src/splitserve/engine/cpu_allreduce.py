"""All-reduce through shared memory, for the CPU ranks of one tensor-parallel group (one host).

gloo's all-reduce goes through loopback TCP, several times slower than shared memory for the
megabyte a prefill layer's output takes. Each rank copies its part into its slot of a shared segment, the group meets at a barrier (gloo, a few bytes), and every rank sums the slots
in rank order, so every rank gets the same bits. The barrier is a counter per rank in the same
segment (x86's ordered stores: a rank's counter is seen after its data), waited on by spinning
with sched_yield. Two sets of slots, used in turn, make one barrier per piece enough: a set is
written again only after the next barrier, which every rank passes only after it has read that
set. A tensor larger than a slot goes in pieces.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable

import torch

SLOT_BYTES = 4 << 20
NAME_BYTES = 96
FLAGS_BYTES = 4096


class ShmAllReduce:
    def __init__(self, pg, rank: int, size: int, timeout_s: float = 600.0) -> None:
        """`pg`: a gloo process group of the ranks (to agree on the segment). `alive`, settable:
        whether the other ranks still run (rank 0: its followers' processes; a follower: rank 0)."""
        self.pg, self.rank, self.size, self.timeout_s = pg, rank, size, timeout_s
        self.alive: Callable[[], bool] = lambda: True
        name = torch.zeros(NAME_BYTES, dtype=torch.uint8)
        if rank == 0:
            raw = f"/dev/shm/splitserve-tp-{os.getpid()}-{uuid.uuid4().hex[:8]}".encode()
            name[: len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
        pg.broadcast(name, 0).wait()
        path = bytes(name.tolist()).rstrip(b"\0").decode()
        nbytes = 2 * size * SLOT_BYTES + FLAGS_BYTES
        if rank == 0:
            with open(path, "wb") as f:
                f.truncate(nbytes)
        pg.barrier().wait()
        self.buf = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
        pg.barrier().wait()
        if rank == 0:
            os.unlink(path)  # every rank has it mapped: it goes with the last of them
        self.turn = 0
        self.flags = self.buf[2 * size * SLOT_BYTES:].view(torch.int64)[:size]  # each rank's last piece
        self.seq = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.view(-1)
        per = SLOT_BYTES // x.element_size()
        for a in range(0, flat.numel(), per):
            self._piece(flat[a:a + per])
        return x

    def _piece(self, part: torch.Tensor) -> None:
        n, dt = part.numel(), part.dtype
        base = self.turn * self.size * SLOT_BYTES
        self.turn ^= 1
        slots = [self.buf[base + r * SLOT_BYTES: base + (r + 1) * SLOT_BYTES].view(dt)[:n] for r in range(self.size)]
        slots[self.rank].copy_(part)
        self.seq += 1
        self.flags[self.rank] = self.seq
        self._wait(self.seq)
        torch.add(slots[0], slots[1], out=part)
        for s in slots[2:]:
            part.add_(s)

    def _wait(self, seq: int) -> None:
        """Until every rank has written its piece `seq` (spinning, yielding the core each time;
        every 1,000 turns it asks `alive` whether the other ranks still are: RuntimeError if not,
        or after `timeout_s`)."""
        flags, turns, start = self.flags, 0, None
        while int(flags.min()) < seq:
            os.sched_yield()
            turns += 1
            if turns % 1000 == 0:
                start = start or time.monotonic()
                if not self.alive() or time.monotonic() - start > self.timeout_s:
                    raise RuntimeError("a tensor-parallel rank stopped answering (shared-memory all-reduce)")
