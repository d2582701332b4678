"""Which part of a Llama-family model one rank of a tensor-parallel group holds (Megatron-style).

At tensor parallel `size`, rank r holds:

* query heads r*H/size .. (r+1)*H/size (the query rows of the fused q/k/v projection, and the
  matching input columns of the output projection);
* its KV heads: K/size of them when `size` divides the K KV heads (each head on one rank), or the
  one head its query heads read when K divides `size` (each head replicated on size/K ranks, as
  vLLM does); a KV head is never split. Its paged KV cache holds only these heads;
* intermediate columns r*I/size .. (r+1)*I/size of gate and up (rows of the fused gate/up
  projection) and the matching input columns of the down projection;
* the rest whole: embeddings, norms, LM head (replicated: every rank's hidden state is the whole
  one after each all-reduce, and rank 0 samples from its own logits).

The output and down projections are row-parallel: each rank multiplies its columns and the group
sums the results (one all-reduce each per layer). `take` cuts a whole parameter of ours down to a
rank's part; `hf_slice` says which rows or columns of a Hugging Face tensor a rank loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import UserError
from .config import ModelConfig

if TYPE_CHECKING:
    import torch


def check_tp(cfg: ModelConfig, tp: int) -> None:
    """UserError (one line) when `cfg` cannot be split `tp` ways."""
    if tp < 1:
        raise UserError(f"tensor parallel size must be at least 1, not {tp}")
    h, k, i = cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size
    if h % tp or i % tp or (k % tp and tp % k):
        raise UserError(f"tp {tp} does not fit this model: its {h} query heads and {i} intermediate columns must "
                        f"divide by tp, and its {k} KV heads must divide by tp or divide tp; try tp "
                        f"{', '.join(str(t) for t in (1, 2, 4, 8, 16) if t != tp and _fits(cfg, t))}")


def _fits(cfg: ModelConfig, tp: int) -> bool:
    k = cfg.num_kv_heads
    return not (cfg.num_heads % tp or cfg.intermediate_size % tp or (k % tp and tp % k))


@dataclass(frozen=True, slots=True)
class Shard:
    """Rank `rank` of `size`: its query heads from `head0`, KV heads from `kv0`, intermediate
    columns from `inter0` (and how many of each)."""

    rank: int
    size: int
    heads: int
    head0: int
    kv_heads: int
    kv0: int
    inter: int
    inter0: int

    @classmethod
    def of(cls, cfg: ModelConfig, rank: int = 0, size: int = 1) -> "Shard":
        check_tp(cfg, size)
        h, k = cfg.num_heads // size, cfg.num_kv_heads
        kvl = k // size if k % size == 0 else 1
        kv0 = rank * kvl if k % size == 0 else rank // (size // k)
        i = cfg.intermediate_size // size
        return cls(rank, size, h, rank * h, kvl, kv0, i, rank * i)

    @property
    def whole(self) -> bool:
        return self.size == 1

    def kv_owners(self, num_kv_heads: int) -> list[int]:
        """The ranks whose KV heads, concatenated in rank order, are all heads once each."""
        return list(range(0, self.size, max(1, self.size // num_kv_heads)))

    def row_ranges(self, cfg: ModelConfig, fused: str) -> list[tuple[int, int]]:
        """Rows of a whole fused parameter ("qkv" or "gate_up") this rank holds, as ranges."""
        hd = cfg.head_dim
        if fused == "qkv":
            q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
            kvr = (self.kv0 * hd, (self.kv0 + self.kv_heads) * hd)
            return [(self.head0 * hd, (self.head0 + self.heads) * hd),
                    (q + kvr[0], q + kvr[1]), (q + kv + kvr[0], q + kv + kvr[1])]
        i = cfg.intermediate_size
        return [(self.inter0, self.inter0 + self.inter), (i + self.inter0, i + self.inter0 + self.inter)]

    def column_range(self, cfg: ModelConfig, row_parallel: str) -> tuple[int, int]:
        """Input columns of a row-parallel weight ("o" or "down") this rank holds."""
        if row_parallel == "o":
            return self.head0 * cfg.head_dim, (self.head0 + self.heads) * cfg.head_dim
        return self.inter0, self.inter0 + self.inter

    def take(self, cfg: ModelConfig, name: str, whole: "torch.Tensor") -> "torch.Tensor":
        """This rank's part of the whole parameter `name` (one of CausalLM's names)."""
        import torch
        if self.whole:
            return whole
        for fused in ("qkv", "gate_up"):
            if f".{fused}_proj." in name:
                return torch.cat([whole[a:b] for a, b in self.row_ranges(cfg, fused)])
        for rp in ("o", "down"):
            if name.endswith(f".{rp}_proj.weight"):
                a, b = self.column_range(cfg, rp)
                return whole[:, a:b]
        return whole

    def hf_slice(self, cfg: ModelConfig, module: str, kind: str) -> tuple[tuple[int, int] | None, bool]:
        """For a Hugging Face tensor of `module` (e.g. "self_attn.k_proj") and `kind` (weight or
        bias): the range this rank loads and whether it is a column range (else rows); None: all."""
        if self.whole:
            return None, False
        hd = cfg.head_dim
        rows = {"self_attn.q_proj": (self.head0 * hd, (self.head0 + self.heads) * hd),
                "self_attn.k_proj": (self.kv0 * hd, (self.kv0 + self.kv_heads) * hd),
                "self_attn.v_proj": (self.kv0 * hd, (self.kv0 + self.kv_heads) * hd),
                "mlp.gate_proj": (self.inter0, self.inter0 + self.inter),
                "mlp.up_proj": (self.inter0, self.inter0 + self.inter)}
        if module in rows:
            return rows[module], False
        if kind == "weight" and module in ("self_attn.o_proj", "mlp.down_proj"):
            return self.column_range(cfg, "o" if module == "self_attn.o_proj" else "down"), True
        return None, False
