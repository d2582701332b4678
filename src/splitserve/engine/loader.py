"""Load a local Hugging Face checkpoint (config.json + *.safetensors, sharded or not) into CausalLM.

Weight names follow transformers' Llama/Mistral/Qwen2 layout; q/k/v and gate/up are copied into
slices of our fused projections. Nothing is downloaded: `path` must be a directory. A rank of a
tensor-parallel group reads only its rows or columns of each tensor (sharding.py `hf_slice`,
through safetensors' slices), never the whole checkpoint.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from ..errors import UserError
from .config import ModelConfig
from .model import CausalLM, build_model
from .sharding import Shard

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def weight_files(path: str | Path) -> list[Path]:
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / n for n in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise UserError(f"{index} lists shards that are missing: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UserError(f"no *.safetensors weights in {path}")
    return files


def _target(model: CausalLM, name: str) -> tuple[torch.Tensor, slice | None, tuple | None] | None:
    """The parameter (and row slice of it) that the HF tensor `name` goes to, and the part of
    that tensor this rank reads (None: all); None to skip."""
    cfg, shard = model.cfg, model.shard
    if name == "model.embed_tokens.weight":
        return model.embed_tokens.weight, None, None
    if name == "model.norm.weight":
        return model.norm.weight, None, None
    if name == "lm_head.weight":
        return None if model.lm_head is None else (model.lm_head.weight, None, None)
    m = _LAYER.fullmatch(name)
    if not m or int(m.group(1)) >= cfg.num_layers:
        return None
    layer, rest = model.decoder_layers()[int(m.group(1))], m.group(2)
    q, kv, inter = shard.heads * cfg.head_dim, shard.kv_heads * cfg.head_dim, shard.inter
    module, kind = rest.rsplit(".", 1)  # kind: weight | bias
    part, columns = shard.hf_slice(cfg, module, kind)
    src = None if part is None else ((slice(None), slice(*part)) if columns else (slice(*part),))
    fused = {
        "self_attn.q_proj": (layer.self_attn.qkv_proj, slice(0, q)),
        "self_attn.k_proj": (layer.self_attn.qkv_proj, slice(q, q + kv)),
        "self_attn.v_proj": (layer.self_attn.qkv_proj, slice(q + kv, q + 2 * kv)),
        "mlp.gate_proj": (layer.mlp.gate_up_proj, slice(0, inter)),
        "mlp.up_proj": (layer.mlp.gate_up_proj, slice(inter, 2 * inter)),
    }
    if module in fused:
        mod, rows = fused[module]
        return getattr(mod, kind), rows, src
    plain = {"self_attn.o_proj": layer.self_attn.o_proj, "mlp.down_proj": layer.mlp.down_proj,
             "input_layernorm": layer.input_layernorm,
             "post_attention_layernorm": layer.post_attention_layernorm}
    if module in plain and getattr(plain[module], kind, None) is not None:
        return getattr(plain[module], kind), None, src
    return None


@torch.no_grad()
def load_weights(model: CausalLM, path: str | Path) -> None:
    """Copy every tensor of the checkpoint into `model`; error if any parameter stays unset."""
    device = model.embed_tokens.weight.device
    filled: dict[int, int] = {}  # id(param) -> rows filled
    for file in weight_files(path):
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            for name in f.keys():
                tgt = _target(model, name)
                if tgt is None:
                    continue
                param, rows, src = tgt
                t = f.get_tensor(name) if src is None else f.get_slice(name)[src]
                dst = param if rows is None else param[rows]
                if tuple(dst.shape) != tuple(t.shape):
                    raise UserError(f"{name}: checkpoint shape {tuple(t.shape)} does not match "
                                    f"config shape {tuple(dst.shape)}")
                dst.copy_(t)
                filled[id(param)] = filled.get(id(param), 0) + dst.shape[0]
    missing = [n for n, p in model.named_parameters() if filled.get(id(p), 0) != p.shape[0]]
    if missing:
        raise UserError(f"checkpoint {path} lacks weights for: {', '.join(missing[:8])}"
                        + (" ..." if len(missing) > 8 else ""))


def load_model(path: str | Path, device: str | torch.device, dtype: torch.dtype,
               max_len: int | None = None, cfg: ModelConfig | None = None, shard: Shard | None = None) -> CausalLM:
    cfg = cfg or ModelConfig.from_dir(path)
    model = build_model(cfg, device, dtype, max_len, shard)
    load_weights(model, path)
    return model
