"""The KV cache tensors, and a request's KV as one contiguous buffer for the prompt->token handoff.

One tensor of shape (layers, 2, num_blocks + 1, block_size, kv_heads, head_dim) holds every
layer's K and V. The extra last block is the *null block*: padded block-table entries and padded
batch rows (CUDA graphs) point at it, and it is never handed out by the block manager.

`export_request` gathers a sequence's first `num_tokens` positions into a `KVExport`, whose
`data` is (layers, 2, num_tokens, kv_heads, head_dim): `data[i]` is layer i's K and V as one
contiguous buffer, which is what a layer-by-layer transport sends. `import_request` allocates
blocks for a new sequence, then scatters an export into them.

The cache tensor is `torch.zeros` by default; a `KVAllocator` puts it elsewhere, e.g. in memory a
peer process can map (serve/shm.py, for `splitserve serve --transport local`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable

import torch

from .block_manager import BlockManager

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "float64": torch.float64}

# (shape, dtype, device) -> a zero-filled tensor of exactly that shape, dtype and device
KVAllocator = Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor]


@dataclass
class KVExport:
    """A request's KV cache: data (layers, 2, num_tokens, kv_heads, head_dim), contiguous."""

    data: torch.Tensor

    @property
    def num_layers(self) -> int:
        return self.data.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.data.shape[2]

    def layer(self, i: int) -> torch.Tensor:
        """Layer i's (2, num_tokens, kv_heads, head_dim) K/V: one contiguous buffer."""
        return self.data[i]

    def metadata(self) -> dict[str, Any]:
        layers, _, tokens, kvh, hd = self.data.shape
        return {"num_layers": layers, "num_tokens": tokens, "num_kv_heads": kvh, "head_dim": hd,
                "dtype": str(self.data.dtype).removeprefix("torch.")}

    def to_bytes(self) -> bytes:
        return self.data.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()

    @classmethod
    def from_bytes(cls, meta: dict[str, Any], buf: bytes | bytearray | memoryview) -> "KVExport":
        shape = (meta["num_layers"], 2, meta["num_tokens"], meta["num_kv_heads"], meta["head_dim"])
        raw = torch.frombuffer(bytearray(buf), dtype=torch.uint8)
        return cls(raw.view(_DTYPES[meta["dtype"]]).view(shape))


class KVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: str | torch.device,
                 alloc: KVAllocator | None = None) -> None:
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        shape = (num_layers, 2, num_blocks + 1, block_size, num_kv_heads, head_dim)
        if alloc is None:
            self.data = torch.zeros(shape, dtype=dtype, device=device)
        else:
            device = torch.device(device)
            self.data = alloc(shape, dtype, device)
            got = (tuple(self.data.shape), self.data.dtype, self.data.device.type)
            if got != (shape, dtype, device.type) or not self.data.is_contiguous():
                raise ValueError(f"KV allocator returned {got}, expected a contiguous {(shape, dtype, device.type)}")
        self.null_block = num_blocks

    @property
    def device(self) -> torch.device:
        return self.data.device

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(self.data[i, 0], self.data[i, 1]) for i in range(self.num_layers)]

    def slots(self, block_table: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [block_table[p // bs] * bs + p % bs for p in range(start, end)]

    def _slot_tensor(self, block_table: list[int], num_tokens: int) -> torch.Tensor:
        return torch.tensor(self.slots(block_table, 0, num_tokens), dtype=torch.long, device=self.device)

    def export_request(self, block_table: list[int], num_tokens: int) -> KVExport:
        """The first `num_tokens` positions of a sequence, gathered from its blocks."""
        slots = self._slot_tensor(block_table, num_tokens)
        flat = self.data.view(self.num_layers, 2, -1, self.num_kv_heads, self.head_dim)
        return KVExport(flat[:, :, slots].contiguous())

    def write_request(self, block_table: list[int], kv: KVExport) -> None:
        """Scatter an export into already allocated blocks."""
        expect = (self.num_layers, 2, self.num_kv_heads, self.head_dim)
        got = (kv.num_layers, kv.data.shape[1], *kv.data.shape[3:])
        if got != expect:
            raise ValueError(f"KV shape (layers, 2, kv_heads, head_dim) {got} does not match "
                             f"this model's {expect}")
        slots = self._slot_tensor(block_table, kv.num_tokens)
        flat = self.data.view(self.num_layers, 2, -1, self.num_kv_heads, self.head_dim)
        flat[:, :, slots] = kv.data.to(device=self.device, dtype=self.data.dtype)

    def import_request(self, kv: KVExport, blocks: BlockManager, seq_id: Hashable,
                       reserve: int = 0) -> list[int]:
        """Allocate blocks for `seq_id` (kv.num_tokens + reserve positions), then write `kv`.
        Raises block_manager.NoFreeBlocks (and changes nothing) when they do not fit."""
        table = blocks.allocate(seq_id, kv.num_tokens + reserve)
        try:
            self.write_request(table, kv)
        except Exception:
            blocks.free(seq_id)
            raise
        return table

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: copy block src to block dst in every layer."""
        if pairs:
            src = torch.tensor([s for s, _ in pairs], device=self.device)
            dst = torch.tensor([d for _, d in pairs], device=self.device)
            self.data[:, :, dst] = self.data[:, :, src]
