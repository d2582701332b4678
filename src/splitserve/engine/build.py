"""What an engine is built from when not told: the model a name or path means (a Hugging Face
checkpoint directory, else a preset), its weights (a rank's shard of them), its tokenizer, and
how many KV blocks to allocate."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import UserError
from .config import ModelConfig
from .device import CPU_KV_BYTES
from .loader import load_model
from .model import CausalLM, build_model, init_random
from .presets import get_preset
from .sharding import Shard
from .tokenizer import Tokenizer


def resolve_model(model: str | Path | ModelConfig) -> tuple[ModelConfig, Path | None]:
    """The model's config, and its checkpoint directory (None for a preset or a given config)."""
    if isinstance(model, ModelConfig):
        return model, None
    p = Path(model)
    if p.is_dir():
        return ModelConfig.from_dir(p), p
    return get_preset(str(model)), None


def build_weights(cfg: ModelConfig, path: Path | None, device: torch.device, dtype: torch.dtype, max_len: int,
                  shard: Shard, weight_seed: int) -> CausalLM:
    """The model with its weights: the checkpoint's at `path`, else random from `weight_seed`."""
    if path is not None:
        return load_model(path, device, dtype, max_len, cfg, shard)
    model = build_model(cfg, device, dtype, max_len, shard)
    init_random(model, weight_seed)
    return model


def default_tokenizer(model: str | Path | ModelConfig, path: Path | None, cfg: ModelConfig) -> Tokenizer | None:
    """The checkpoint's tokenizer.json; the byte-level one for the `tiny` presets; else none."""
    if path is not None:
        return Tokenizer.from_dir(path, cfg.eos_token_ids)
    tiny = isinstance(model, str) and model.startswith("tiny")  # tiny, tiny-<N>l
    return Tokenizer.tiny() if tiny else None


def default_num_blocks(cfg: ModelConfig, dtype: torch.dtype, device: torch.device, max_model_len: int,
                       block_size: int, max_num_seqs: int, kv_bytes: int | None, kv_heads: int | None = None) -> int:
    """KV blocks of `block_size` tokens that `kv_bytes` hold (default: 1 GiB on CPU, 90% of free
    memory less 4 GiB on CUDA), never more than `max_num_seqs` full-length sequences need.
    kv_heads: the KV heads one rank holds (default: all)."""
    per_block = cfg.kv_bytes_per_token(dtype.itemsize) * block_size * (kv_heads or cfg.num_kv_heads) // cfg.num_kv_heads
    enough = max_num_seqs * -(-max_model_len // block_size)  # every sequence at full length
    if kv_bytes is None:
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            reserve = 4 << 30  # activations, logits, CUDA graph pool
            kv_bytes = int(0.9 * (free - reserve))
        else:
            kv_bytes = CPU_KV_BYTES
    n = min(enough, kv_bytes // per_block)
    if n < 1:
        raise UserError(f"no room for a KV cache: {kv_bytes} bytes for blocks of {per_block} bytes")
    return n
