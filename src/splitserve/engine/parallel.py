"""A tensor-parallel group from one rank's side: its processes, its two process groups, the
collectives a step needs, and the KV cache of the whole group as rank 0 sees it.

Rank 0 is the engine (scheduler, sampler, KV blocks, the connector); ranks 1.. are followers
(rank.py), started by rank 0 as child processes of this host and joined through a TCPStore on
127.0.0.1. Two process groups, made directly (no torch.distributed default group, no global
state): `ctl`, gloo on the CPU, for rank 0's commands (a pickled tuple: run this step, write or
read this KV); `dev`, for tensors on the ranks' devices (NCCL on CUDA, the same gloo group on
CPU): the all-reduce of every row-parallel layer (on CPU through shared memory instead,
cpu_allreduce.py), KV heads gathered to rank 0 and KV broadcast from it. One engine step is one command and one collective forward on every rank.

The KV a connector sees is whole (every KV head): `KVShards` gathers the heads of the ranks
holding them for rank 0 (a streamed layer, a finished prompt, a live request's export) and sends
each rank its heads of KV written from elsewhere, so a transfer between groups of any two sizes
re-shards on the way (each side through its rank 0).

A follower that dies, or a collective that fails, is a `GroupFailed`: the engine cannot go on
(its ranks may be in different steps), so the process holding rank 0 exits and is replaced as a
worker is; followers exit when rank 0's process is gone (the command channel closes, and
PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import datetime
import logging
import os
import pickle
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist

from .config import ModelConfig
from .cpu_allreduce import ShmAllReduce
from .sharding import Shard

logger = logging.getLogger(__name__)

CTL_TIMEOUT = datetime.timedelta(days=365)  # followers wait for rank 0's next command this long
DEV_TIMEOUT = datetime.timedelta(seconds=600)  # one collective, at most


class GroupFailed(RuntimeError):
    """A rank of the tensor-parallel group died or a collective failed: the group must go."""


@dataclass
class RankSpec:
    """What a follower builds (rank 0 decides it all, so every rank holds the same model, cache
    layout and block count)."""

    model: str | Path | ModelConfig  # preset name, checkpoint directory or ModelConfig
    device_type: str       # cpu | cuda
    device_base: int       # rank r runs on cuda:(base + r)
    dtype: torch.dtype
    weight_seed: int
    max_model_len: int
    num_blocks: int
    block_size: int
    threads: int
    cuda_graphs: bool
    max_num_seqs: int
    kernels: str = "auto"  # kernels.py


def rank_device(spec: RankSpec, rank: int) -> torch.device:
    return torch.device("cpu") if spec.device_type == "cpu" else torch.device("cuda", spec.device_base + rank)


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (a follower never outlives rank 0)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Collectives(Protocol):
    """The calls this module makes on a process-group backend (ProcessGroupGloo, ProcessGroupNCCL;
    torch's stubs leave them out of `Backend`, which has them at runtime)."""

    def broadcast(self, tensor: torch.Tensor, root: int) -> dist.Work: ...

    def allreduce(self, tensors: list[torch.Tensor]) -> dist.Work: ...

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor]) -> dist.Work: ...


def gloo(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> Collectives:
    """A gloo process group of the ranks on 127.0.0.1."""
    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # torch's stubs lack _Options
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    opts._timeout = timeout
    return dist.ProcessGroupGloo(store, rank, size, opts)  # type: ignore[return-value]  # see Collectives


def nccl(store: dist.Store, rank: int, size: int) -> Collectives:
    """An NCCL process group of the ranks, with NCCL's default options."""
    return dist.ProcessGroupNCCL(store, rank, size)  # type: ignore[call-arg,return-value]  # stubs: options required


class Group:
    def __init__(self, store: dist.Store, rank: int, size: int, device: torch.device) -> None:
        self.rank, self.size, self.device = rank, size, device
        self.store: dist.Store | None = None  # rank 0's rendezvous, kept alive with the group (start_group)
        self.shm_reduce: ShmAllReduce | None = None
        self.ctl: Collectives | None = gloo(dist.PrefixStore("ctl", store), rank, size, CTL_TIMEOUT)
        self.dev: Collectives | None
        if device.type == "cuda":
            torch.cuda.set_device(device)
            self.dev = nccl(dist.PrefixStore("dev", store), rank, size)
        else:
            self.dev = gloo(dist.PrefixStore("dev", store), rank, size, DEV_TIMEOUT)
            self.shm_reduce = ShmAllReduce(self.dev, rank, size)

    def close(self) -> None:
        """Drop the process groups while their store lives: left to the interpreter's exit, they
        went in any order, and a follower stopped right after its start aborted in gloo's
        teardown (std::terminate, status -6)."""
        self.ctl = self.dev = self.shm_reduce = None

    def _ctl(self) -> Collectives:
        if self.ctl is None:
            raise GroupFailed("the tensor-parallel group is closed")
        return self.ctl

    def _dev(self) -> Collectives:
        if self.dev is None:
            raise GroupFailed("the tensor-parallel group is closed")
        return self.dev

    # ---- rank 0's commands ------------------------------------------------------------------
    def send(self, cmd: tuple) -> None:
        ctl = self._ctl()
        raw = torch.frombuffer(bytearray(pickle.dumps(cmd)), dtype=torch.uint8)
        ctl.broadcast(torch.tensor([raw.numel()], dtype=torch.long), 0).wait()
        ctl.broadcast(raw, 0).wait()

    def receive(self) -> tuple:
        ctl = self._ctl()
        n = torch.zeros(1, dtype=torch.long)
        ctl.broadcast(n, 0).wait()
        raw = torch.empty(int(n), dtype=torch.uint8)
        ctl.broadcast(raw, 0).wait()
        return pickle.loads(raw.numpy().tobytes())

    # ---- collectives on the devices ---------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":  # ranks of one host: shared memory, not loopback TCP
            if self.shm_reduce is None:
                raise GroupFailed("the tensor-parallel group is closed")
            return self.shm_reduce(x)
        self._dev().allreduce([x]).wait()
        return x

    def gather_heads(self, local: torch.Tensor, owners: list[int]) -> torch.Tensor:
        """Every rank's KV heads (dim -2) of `local` put side by side in rank order, each head
        once (`owners`: the ranks whose heads make the whole)."""
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(self.size)]
        self._dev().allgather([parts], [local]).wait()
        return torch.cat([parts[r] for r in owners], dim=-2)

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        self._dev().broadcast(x, 0).wait()
        return x


class Ranks:
    """Rank 0's hold on its group: the group, and the followers' processes."""

    def __init__(self, group: Group, procs: list[subprocess.Popen]) -> None:
        self.group, self.procs = group, procs

    def check(self) -> None:
        """GroupFailed if a follower has exited."""
        for r, p in enumerate(self.procs, 1):
            if p.poll() is not None:
                raise GroupFailed(f"tensor-parallel rank {r} exited (status {p.returncode})")

    def close(self) -> None:
        """Stop the followers (killed if they do not stop within 10 s)."""
        if all(p.poll() is None for p in self.procs):
            try:
                self.group.send(("stop",))
            except (RuntimeError, OSError) as e:  # a follower gone meanwhile (gloo's error): the wait below ends the rest
                logger.debug("stop not sent to the tensor-parallel group: %r", e)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.group.close()


def start_group(spec: RankSpec, size: int) -> Ranks:
    """Start followers 1..size-1 of a group whose rank 0 is this process; join them."""
    store = dist.TCPStore("127.0.0.1", 0, size, True, wait_for_workers=False)
    env = {**os.environ, "OMP_NUM_THREADS": str(spec.threads)}
    procs = [subprocess.Popen([sys.executable, "-m", "splitserve.engine.rank", str(r), str(size), str(store.port),
                               str(rank_device(spec, r))], env=env, stdin=subprocess.DEVNULL) for r in range(1, size)]
    try:
        group = Group(store, 0, size, rank_device(spec, 0))
        group.send(("spec", spec))
    except Exception:
        for p in procs:
            p.kill()
        raise
    group.store = store  # the followers' rendezvous: kept alive with the group
    if group.shm_reduce is not None:  # a CPU group
        group.shm_reduce.alive = lambda: all(p.poll() is None for p in procs)
    return Ranks(group, procs)


class KVShards:
    """The group's KV cache as rank 0 reads and writes it: whole K/V (every KV head) at slot ids,
    this rank's heads in `kv`, the others' through the group. Followers mirror each call (rank.py)."""

    def __init__(self, kv, group: Group | None, shard: Shard, num_kv_heads: int) -> None:
        self.kv, self.group, self.shard = kv, group, shard
        self.owners = shard.kv_owners(num_kv_heads)

    def local(self, layer: int | None, slots: torch.Tensor) -> torch.Tensor:
        """This rank's heads at `slots`: (2, n, heads, hd) of one layer, or (L, 2, n, heads, hd)."""
        kv = self.kv
        if layer is None:
            return kv.data.view(kv.num_layers, 2, -1, kv.num_kv_heads, kv.head_dim)[:, :, slots]
        return kv.data[layer].view(2, -1, kv.num_kv_heads, kv.head_dim)[:, slots]

    def gather(self, layer: int | None, slots: torch.Tensor) -> torch.Tensor:
        """Every head at `slots` (a collective: every rank calls it, in the same step)."""
        part = self.local(layer, slots)
        return part.contiguous() if self.group is None else self.group.gather_heads(part, self.owners)

    def put_local(self, layer: int | None, slots: torch.Tensor, whole: torch.Tensor) -> None:
        """Write this rank's heads of the whole K/V `whole` at `slots`."""
        kv, s = self.kv, self.shard
        part = whole[..., s.kv0:s.kv0 + s.kv_heads, :] if self.group is not None else whole
        part = part.to(device=kv.device, dtype=kv.data.dtype)
        if layer is None:
            kv.data.view(kv.num_layers, 2, -1, kv.num_kv_heads, kv.head_dim)[:, :, slots] = part
        else:
            kv.data[layer].view(2, -1, kv.num_kv_heads, kv.head_dim)[:, slots] = part

    # ---- between steps, from rank 0 -----------------------------------------------------------
    def write(self, layer: int | None, slots: list[int], whole: torch.Tensor) -> None:
        """Whole K/V from elsewhere into the group's cache (rank 0 tells the followers)."""
        if self.group is not None:
            self.group.send(("write", layer, slots, tuple(whole.shape)))
            whole = self.group.broadcast(whole.to(device=self.group.device, dtype=self.kv.data.dtype).contiguous())
        self.put_local(layer, self.slot_tensor(slots), whole)

    def read(self, layer: int | None, slots: list[int]) -> torch.Tensor:
        if self.group is not None:
            self.group.send(("read", layer, slots))
        return self.gather(layer, self.slot_tensor(slots))

    def slot_tensor(self, slots: list[int]) -> torch.Tensor:
        """Slot ids as a tensor on this rank's device."""
        return torch.tensor(slots, dtype=torch.long, device=self.kv.device)
