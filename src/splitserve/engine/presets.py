"""Named model shapes for random initialisation (no checkpoint needed).

`tiny` is for tests and `splitserve generate --model tiny` (byte-level vocabulary of 259, see
tokenizer.tiny_tokenizer); `small` is a CPU benchmark shape, and `small-mha` the same with a KV
head per query head (4x its KV per token, as Llama-2-7B/13B against GQA models: where moving KV
between workers is a large cost); `llama3-8b`, `llama3.1-8b` and
`llama2-70b` are the real shapes for GPU measurement. Any preset may be reduced to N decoder
layers with a `-<N>l` suffix, e.g. `llama2-70b-8l` (8 of the 80 layers; fits one 80 GB GPU).
"""

from __future__ import annotations

import re

from ..errors import UserError
from .config import ModelConfig, RopeScaling

TINY_VOCAB = 259  # 3 special tokens + 256 bytes

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        arch="llama", vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
        max_position_embeddings=512, bos_token_id=1, eos_token_ids=(2,), init_std=0.1),
    "small": ModelConfig(
        arch="llama", vocab_size=32000, hidden_size=512, intermediate_size=1408, num_layers=8,
        num_heads=8, num_kv_heads=2, head_dim=64, rms_norm_eps=1e-5, rope_theta=10000.0,
        max_position_embeddings=4096),
    "small-mha": ModelConfig(
        arch="llama", vocab_size=32000, hidden_size=512, intermediate_size=1408, num_layers=8,
        num_heads=8, num_kv_heads=8, head_dim=64, rms_norm_eps=1e-5, rope_theta=10000.0,
        max_position_embeddings=4096),
    "llama3-8b": ModelConfig(
        arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
        max_position_embeddings=8192, bos_token_id=128000, eos_token_ids=(128001, 128009)),
    "llama3.1-8b": ModelConfig(
        arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192), max_position_embeddings=131072,
        bos_token_id=128000, eos_token_ids=(128001, 128008, 128009)),
    "llama2-70b": ModelConfig(
        arch="llama", vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_layers=80,
        num_heads=64, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=10000.0,
        max_position_embeddings=4096),
}


def get_preset(name: str) -> ModelConfig:
    """The preset `name`, or `<preset>-<N>l` for the same shape with N decoder layers."""
    if name in PRESETS:
        return PRESETS[name]
    m = re.fullmatch(r"(.+)-(\d+)l", name)
    if m and m.group(1) in PRESETS and int(m.group(2)) > 0:
        return PRESETS[m.group(1)].with_layers(int(m.group(2)))
    raise UserError(f"unknown model {name!r}: not a directory and not a preset "
                    f"({', '.join(PRESETS)}, optionally with -<N>l for N layers)")


def is_preset(name: str) -> bool:
    try:
        get_preset(name)
    except UserError:
        return False
    return True
