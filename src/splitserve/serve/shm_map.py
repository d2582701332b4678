"""The writer's side of `--transport local`: a peer's KV cache (its `RegionHandle`, shm.py) mapped
into this process, so that K/V written into `tensor` lands in the peer's reserved blocks. CPU: the
named shared-memory segment, attached without registering it with this process's resource
tracker (whose death must not unlink the peer's segment); CUDA: torch's CUDA IPC. Lifetimes and
limits: shm.py's docstring."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import torch

from .shm import DTYPES, RegionHandle, RegionUnavailable, host_id

if TYPE_CHECKING:
    from multiprocessing.shared_memory import SharedMemory


class MappedRegion:
    """A peer's KV cache mapped into this process; `tensor` is that cache (writes land in the
    peer's memory). Raises RegionUnavailable when it cannot be mapped here."""

    def __init__(self, handle: RegionHandle) -> None:
        self.handle = handle
        self._shm: SharedMemory | None = None
        self.tensor: torch.Tensor | None  # None once closed
        if handle.host != host_id():
            raise RegionUnavailable(f"the peer's KV cache is on another host ({handle.host.split('/')[0]}); "
                                    f"--transport local needs every worker on one host: use --transport tcp")
        dtype = DTYPES[handle.dtype]
        # a plain tensor wherever it is mapped: one first mapped inside torch.inference_mode (a
        # layer hook of the prompt step) would be an inference tensor, which refuses the in-place
        # writes of a later put made outside that mode (a serialized transfer after the step)
        with torch.inference_mode(False):
            if handle.kind == "shm":
                self.tensor = self._map_shm(handle, dtype)
            else:
                self.tensor = self._map_cuda(handle, dtype)

    @property
    def key(self) -> str:
        return self.handle.key

    def _map_shm(self, h: RegionHandle, dtype: torch.dtype) -> torch.Tensor:
        from multiprocessing.shared_memory import SharedMemory

        try:
            if sys.version_info >= (3, 13):
                shm = SharedMemory(name=h.name, track=False)
            else:
                shm = SharedMemory(name=h.name)
                if h.name.rsplit("-", 2)[-2:-1] != [str(os.getpid())]:  # <prefix><owner pid>-<hex>
                    from multiprocessing import resource_tracker
                    # 3.12 and older register an attachment like a creation: were this process to
                    # die, its tracker would unlink the peer's segment. `_name` (private, so not in
                    # typeshed) is the name as the tracker registered it, with its leading slash.
                    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]  # noqa: SLF001
        except FileNotFoundError:
            raise RegionUnavailable(f"shared-memory segment {h.name} not found: its worker exited, or "
                                    f"this worker does not share /dev/shm with it (another container): "
                                    f"use --transport tcp") from None
        if shm.size < h.nbytes:
            shm.close()
            raise RegionUnavailable(f"segment {h.name} holds {shm.size} bytes, its handle says {h.nbytes}")
        self._shm = shm
        numel = h.nbytes // dtype.itemsize
        return torch.frombuffer(shm.buf, dtype=dtype, count=numel).view(h.shape)

    @staticmethod
    def _map_cuda(h: RegionHandle, dtype: torch.dtype) -> torch.Tensor:
        if not torch.cuda.is_available():
            raise RegionUnavailable("the peer's KV cache is in CUDA memory but CUDA is not available here")
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        c = h.cuda or {}
        try:
            t = rebuild_cuda_tensor(torch.Tensor, torch.Size(c["size"]), tuple(c["stride"]), c["offset"],
                                    torch.storage.TypedStorage, dtype, c["device"], bytes(c["handle"]),
                                    c["storage_size_bytes"], c["storage_offset_bytes"], False,
                                    bytes(c["ref_counter_handle"]), c["ref_counter_offset"],
                                    bytes(c["event_handle"]) if c.get("event_handle") is not None else None,
                                    c["event_sync_required"])
        except (KeyError, RuntimeError) as e:
            raise RegionUnavailable(f"cannot open the peer's CUDA IPC handle: {e}") from None
        if tuple(t.shape) != h.shape:
            raise RegionUnavailable(f"CUDA region shape {tuple(t.shape)} != handle shape {h.shape}")
        return t

    def close(self) -> None:
        """Unmap (idempotent). Nothing else may still hold a view of `tensor`."""
        self.tensor = None
        shm, self._shm = self._shm, None
        if shm is not None:
            try:
                shm.close()
            except BufferError:
                self._shm = shm  # a view is still alive somewhere; unmapped when this object goes
