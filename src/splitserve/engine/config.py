"""ModelConfig: the shape of a Llama-family decoder, read from a Hugging Face `config.json`.

Supported `model_type`s: llama (Llama 2, Llama 3/3.1 incl. the `llama3` RoPE scaling), mistral
(optional sliding window) and qwen2 (q/k/v biases). Both the transformers 4.x spelling
(`rope_theta` + `rope_scaling`) and the 5.x spelling (`rope_parameters`) are understood.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import UserError

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. `kind` is one of SUPPORTED_ROPE ("default" means none)."""

    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    arch: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 32
    head_dim: int = 128
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    # Layers that use the sliding window; None means every layer (when sliding_window is set).
    sliding_layers: tuple[int, ...] | None = None
    bos_token_id: int | None = 1
    eos_token_ids: tuple[int, ...] = (2,)
    torch_dtype: str | None = None
    init_std: float = 0.02  # only for random initialisation of presets

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UserError(f"num_attention_heads {self.num_heads} is not a multiple of "
                            f"num_key_value_heads {self.num_kv_heads}")

    def window_for_layer(self, layer: int) -> int | None:
        if self.sliding_window is None:
            return None
        if self.sliding_layers is None or layer in self.sliding_layers:
            return self.sliding_window
        return None

    def with_layers(self, num_layers: int) -> "ModelConfig":
        return replace(self, num_layers=num_layers)

    # ---- sizes -------------------------------------------------------------------------
    def num_params(self) -> int:
        h, i, hd = self.hidden_size, self.intermediate_size, self.head_dim
        q, kv = self.num_heads * hd, self.num_kv_heads * hd
        attn = h * (q + 2 * kv) + q * h
        if self.qkv_bias:
            attn += q + 2 * kv
        if self.o_bias:
            attn += h
        mlp = 3 * h * i + (2 * i + h if self.mlp_bias else 0)
        per_layer = attn + mlp + 2 * h
        emb = self.vocab_size * h
        return emb * (1 if self.tie_word_embeddings else 2) + self.num_layers * per_layer + h

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    # ---- Hugging Face config.json ---------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        mtype = d.get("model_type")
        if mtype not in SUPPORTED_TYPES:
            raise UserError(f"unsupported model_type {mtype!r}; supported: {', '.join(SUPPORTED_TYPES)}")
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise UserError(f"unsupported hidden_act {act!r}; only silu (SwiGLU) is supported")
        hidden = int(d["hidden_size"])
        heads = int(d["num_attention_heads"])
        head_dim = d.get("head_dim") or hidden // heads
        theta, scaling = _rope_from_hf(d)

        window, sliding_layers = None, None
        if mtype == "mistral":
            window = d.get("sliding_window")
        elif mtype == "qwen2" and d.get("use_sliding_window"):
            window = d.get("sliding_window")
            types = d.get("layer_types")
            if types:
                sliding_layers = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
            else:
                first = int(d.get("max_window_layers", 0))
                sliding_layers = tuple(range(first, int(d["num_hidden_layers"])))

        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        attention_bias = bool(d.get("attention_bias", False))
        return cls(
            arch=mtype,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=True if mtype == "qwen2" else attention_bias,
            o_bias=False if mtype == "qwen2" else attention_bias,
            mlp_bias=bool(d.get("mlp_bias", False)),
            sliding_window=int(window) if window else None,
            sliding_layers=sliding_layers,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=d.get("torch_dtype") or d.get("dtype"),
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        p = Path(path) / "config.json"
        if not p.is_file():
            raise UserError(f"no config.json in {path}")
        cfg = cls.from_hf_dict(json.loads(p.read_text()))
        gen = Path(path) / "generation_config.json"
        if gen.is_file():  # generation_config's EOS list (Llama 3 instruct) takes precedence
            eos = json.loads(gen.read_text()).get("eos_token_id")
            if eos is not None:
                cfg = replace(cfg, eos_token_ids=tuple(eos) if isinstance(eos, list) else (int(eos),))
        return cfg


def _rope_from_hf(d: dict[str, Any]) -> tuple[float, RopeScaling]:
    params = d.get("rope_parameters")  # transformers 5.x
    if params is None:
        params = dict(d.get("rope_scaling") or {})
        params.setdefault("rope_theta", d.get("rope_theta", 10000.0))
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind not in SUPPORTED_ROPE:
        raise UserError(f"unsupported RoPE scaling {kind!r}; supported: {', '.join(SUPPORTED_ROPE)}")
    theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
    scaling = RopeScaling(
        kind=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings",
                                                        d.get("max_position_embeddings", 8192))),
    )
    return theta, scaling


def rope_inv_freq(cfg: ModelConfig):
    """Per-pair inverse frequencies (head_dim/2,), float32, with the config's scaling applied."""
    import torch

    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    s = cfg.rope_scaling
    if s.kind == "linear":
        return inv / s.factor
    if s.kind == "llama3":
        # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, and the band
        # between the two wavelength thresholds interpolates smoothly between the two.
        old_len = s.original_max_position_embeddings
        long_wavelen = old_len / s.low_freq_factor
        short_wavelen = old_len / s.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > long_wavelen, inv / s.factor, inv)
        t = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
        blended = (1 - t) * scaled / s.factor + t * scaled
        between = (wavelen >= short_wavelen) & (wavelen <= long_wavelen)
        return torch.where(between, blended, scaled)
    return inv
