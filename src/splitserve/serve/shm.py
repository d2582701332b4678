"""A worker's KV cache in memory that other processes on the same host can map (`--transport local`).

The token worker allocates its KV cache with a `SharedKVRegion` (the `kv_alloc` of `LLMEngine`);
its `handle` (a small `RegionHandle`, sent once in the worker's `hello`) lets a prompt worker on
the same host map that cache with `MappedRegion` (shm_map.py) and write K/V straight into the
token worker's reserved blocks: a one-sided write, as over NVLink or RDMA in the paper.
kv/transports.py's LocalTransport does those writes; this module only allocates, describes and
unlinks the memory (the owner's side); shm_map.py maps and unmaps it (the writer's side).

- CPU: the cache is a named POSIX shared-memory segment (`multiprocessing.shared_memory`, mode
  0600, so only the same user can map it), viewed as a tensor with `torch.frombuffer`. Its space
  in /dev/shm is reserved at allocation (`posix_fallocate`), so a full /dev/shm is a clear error at
  start rather than a SIGBUS mid-run.
- CUDA: the cache is an ordinary CUDA tensor shared with torch's own CUDA IPC mechanism
  (`torch.multiprocessing.reductions.reduce_tensor` on the owner's side, `rebuild_cuda_tensor` on
  the mapping side). Not yet run on a GPU: its tests skip without CUDA. Known limits: a process
  cannot map its own handle (CUDA IPC refuses; a worker never writes to itself); the handle names
  the owner's device by index, so workers must see the same devices (same CUDA_VISIBLE_DEVICES);
  the owner's memory must outlive every mapping (the writer drops its mapping on `peer_down`); and
  torch's IPC reference counter is shared by every mapper of the one handle, which only matters
  when the owner frees the cache, i.e. when it exits.

Segment lifetime (CPU). A segment is named `splitserve-kv-<owner pid>-<random>` and unlinked by
its owner: `SharedKVRegion.close()` at the worker's normal exit (the router's `stop`) and on
SIGTERM (the worker's handler unlinks, then terminates). Unlinking right after the peer mapped it
is not possible: a prompt worker that is restarted (or a second one) must map it again later.
When the owner is killed with SIGKILL:
  1. Python's resource tracker (a helper process each worker starts with its first segment, which
     outlives a SIGKILL of the worker) unlinks it within moments, with a "leaked shared_memory
     objects" warning on stderr. Mapping processes unregister their attachments from their own
     tracker, so a dying writer never unlinks its peer's segment.
  2. If the tracker is killed too (the worker's whole process group got SIGKILL; or
     `--backend ray`, whose shutdown kills the actors' processes, trackers included), the segment
     stays in /dev/shm until the next `SharedKVRegion` on this host is created (a restarted
     worker, or the next cluster): it sweeps every
     `splitserve-kv-<pid>-*` whose pid is no longer alive. So at most one segment per killed
     worker leaks, until then. This assumes one PID namespace per /dev/shm (a recycled pid keeps
     its dead owner's segment until swept later).
The memory itself is freed once the last mapping closes: the owner's, and each writer's, which
writers drop when the router reports the owner down.
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import UserError

if TYPE_CHECKING:
    from multiprocessing.shared_memory import SharedMemory

SEGMENT_PREFIX = "splitserve-kv-"
SHM_DIR = Path("/dev/shm")
DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.bfloat16, torch.float16,
                                                       torch.float64)}


class RegionUnavailable(Exception):
    """A peer's KV region cannot be mapped here (other host, gone, or an incompatible layout)."""


def host_id() -> str:
    """This host, as far as shared memory goes: hostname and kernel boot id."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


@dataclass(frozen=True, slots=True)
class RegionHandle:
    """What a peer needs to map a KV cache: where it is (`kind`, `host`, and the segment `name` or
    the CUDA IPC fields in `cuda`) and its layout (`shape`, `dtype`)."""

    kind: str                       # "shm" | "cuda"
    host: str
    shape: tuple[int, ...]          # (layers, 2, blocks + 1, block_size, kv_heads, head_dim)
    dtype: str
    name: str = ""                  # shm: the segment's name
    cuda: dict | None = None        # cuda: torch's IPC fields (see _cuda_fields)

    @property
    def key(self) -> str:
        """Identifies the allocation: a restarted peer has a new one."""
        if self.kind == "shm":
            return self.name
        assert self.cuda is not None  # kind "cuda": its IPC fields
        return bytes(self.cuda["handle"]).hex() + f"+{self.cuda['storage_offset_bytes']}"

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * DTYPES[self.dtype].itemsize

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "host": self.host, "shape": list(self.shape), "dtype": self.dtype,
                "name": self.name, "cuda": self.cuda}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "RegionHandle":
        try:
            h = cls(str(d["kind"]), str(d["host"]), tuple(int(s) for s in d["shape"]), str(d["dtype"]),
                    str(d.get("name") or ""), d.get("cuda"))
        except (KeyError, TypeError, ValueError) as e:
            raise RegionUnavailable(f"malformed KV region handle: {e!r}") from None
        if h.kind not in ("shm", "cuda") or h.dtype not in DTYPES or len(h.shape) != 6:
            raise RegionUnavailable(f"unsupported KV region handle ({h.kind}, {h.dtype}, shape {h.shape})")
        return h


# ---- the owner's side ----------------------------------------------------------------------
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purpose
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] not in "ZX"
    except (OSError, ValueError, IndexError):
        return True


def sweep_stale(shm_dir: Path = SHM_DIR, prefix: str = SEGMENT_PREFIX) -> list[str]:
    """Unlink every segment `<prefix><pid>-*` in `shm_dir` whose owner pid is not alive; returns
    their names. (Segments of a SIGKILLed worker whose resource tracker died with it.)"""
    gone: list[str] = []
    try:
        entries = list(shm_dir.iterdir())
    except OSError:
        return gone
    for p in entries:
        if not p.name.startswith(prefix):
            continue
        pid = p.name[len(prefix):].partition("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _pid_alive(int(pid)):
            continue
        try:
            p.unlink()
            gone.append(p.name)
        except OSError:
            pass  # another sweeper got there first, or not ours to remove
    return gone


def _cuda_fields(t: torch.Tensor) -> dict[str, Any]:
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(t)
    (_tcls, size, stride, offset, _scls, _dtype, device, handle, size_bytes, offset_bytes, _grad,
     rc_handle, rc_offset, ev_handle, ev_sync) = args
    return {"size": list(size), "stride": list(stride), "offset": int(offset), "device": int(device),
            "handle": bytes(handle), "storage_size_bytes": int(size_bytes),
            "storage_offset_bytes": int(offset_bytes), "ref_counter_handle": bytes(rc_handle),
            "ref_counter_offset": int(rc_offset),
            "event_handle": bytes(ev_handle) if ev_handle is not None else None,
            "event_sync_required": bool(ev_sync)}


class SharedKVRegion:
    """Allocates one worker's KV cache where same-host peers can map it (call it as KVCache's
    allocator: `(shape, dtype, device) -> zeroed tensor`), describes it (`handle`) and unlinks it
    (`close`). One allocation per region."""

    def __init__(self, shm_dir: Path = SHM_DIR, prefix: str = SEGMENT_PREFIX) -> None:
        self.shm_dir, self.prefix = shm_dir, prefix
        self.handle: RegionHandle | None = None
        self.swept: list[str] = []
        self._shm: SharedMemory | None = None

    def __call__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if self.handle is not None:
            raise RuntimeError("a SharedKVRegion holds one KV cache")
        device = torch.device(device)
        dname = str(dtype).removeprefix("torch.")
        if dname not in DTYPES:
            raise UserError(f"--transport local does not support KV dtype {dname}")
        shape = tuple(int(s) for s in shape)
        if device.type == "cpu":
            t, shm = self._alloc_shm(shape, dtype)
            self.handle = RegionHandle("shm", host_id(), shape, dname, name=shm.name)
        elif device.type == "cuda":
            t = torch.zeros(shape, dtype=dtype, device=device)
            self.handle = RegionHandle("cuda", host_id(), shape, dname, cuda=_cuda_fields(t))
        else:
            raise UserError(f"--transport local needs a cpu or cuda device, not {device.type}")
        return t

    def _alloc_shm(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, SharedMemory]:
        """A zeroed tensor of `shape` in a new shared-memory segment (kept in `_shm`), and the segment."""
        from multiprocessing.shared_memory import SharedMemory

        self.swept = sweep_stale(self.shm_dir, self.prefix)
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * dtype.itemsize
        name = f"{self.prefix}{os.getpid()}-{secrets.token_hex(4)}"
        shm = SharedMemory(name=name, create=True, size=nbytes)  # zero-filled by the kernel
        try:
            fd = getattr(shm, "_fd", -1)
            if fd >= 0 and hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, nbytes)
        except OSError as e:
            shm.close()
            shm.unlink()
            if e.errno in (errno.ENOSPC, errno.ENOMEM):
                raise UserError(f"no room in shared memory for a {nbytes / 2**20:.0f} MiB KV cache "
                                f"({self.shm_dir} is full): enlarge it (docker --shm-size), lower "
                                f"--num-blocks, or use --transport tcp") from None
            raise
        self._shm = shm
        return torch.frombuffer(shm.buf, dtype=dtype, count=numel).view(shape), shm

    def close(self) -> None:
        """Unlink the segment (its name); the memory lives on until every mapping is closed.
        Idempotent. CUDA: nothing to do (the memory goes with the process)."""
        shm, self._shm = self._shm, None
        if shm is not None:
            try:
                shm.unlink()  # also unregisters it from the resource tracker
            except FileNotFoundError:
                pass  # swept or unlinked already
