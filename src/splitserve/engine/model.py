"""The Llama-family decoder as an nn.Module: embeddings, N x (RMSNorm, GQA attention with RoPE,
RMSNorm, SwiGLU MLP), final RMSNorm, LM head (tied or not).

It works on a flattened batch: `forward(input_ids (T,), positions (T,), meta)` returns the final
hidden states (T, hidden); `compute_logits` applies the LM head to the rows that need sampling.
q/k/v and gate/up are fused into one matmul each; the loader splits Hugging Face weights into them.

Built for one rank of a tensor-parallel group (`shard`, sharding.py), a layer holds that rank's
heads and intermediate columns; its output and down projections are row-parallel (`RowLinear`):
the rank's partial product goes through `reduce` (the group's all-reduce) before the bias.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from .attention import AttentionMetadata, paged_attention
from .config import ModelConfig, rope_inv_freq
from .kernels import Kernels
from .sharding import Shard


FEW_ROWS = 8  # logits rows up to which compute_logits multiplies the other way round on CPU

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float() if dtype in (torch.float16, torch.bfloat16) else x
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class Rotary(nn.Module):
    """cos/sin tables (max_len, head_dim/2), float32, built by `build` once the device is known."""

    def __init__(self, cfg: ModelConfig, max_len: int) -> None:
        super().__init__()
        self.cfg, self.max_len = cfg, max_len
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)

    def build(self, device: torch.device | str) -> None:
        inv = rope_inv_freq(self.cfg).to(device)
        freqs = torch.outer(torch.arange(self.max_len, device=device, dtype=torch.float32), inv)
        self.cos, self.sin = freqs.cos(), freqs.sin()

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # (T, 1, hd/2)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + hd/2) of x (T, heads, hd) by the position's angles."""
    dtype = x.dtype
    xf = x.float() if dtype in (torch.float16, torch.bfloat16) else x
    x1, x2 = xf.chunk(2, dim=-1)
    cos, sin = cos.to(xf.dtype), sin.to(xf.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(dtype)


def _no_reduce(x: torch.Tensor) -> torch.Tensor:
    return x


class RowLinear(nn.Linear):
    """A row-parallel linear layer: this rank's input columns, the group's sum, then the bias
    (whole on every rank, added once). `reduce` is set by the group (identity alone)."""

    reduce = staticmethod(_no_reduce)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, shard: Shard) -> None:
        super().__init__()
        self.nh, self.kvh, self.hd = shard.heads, shard.kv_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.nh + 2 * self.kvh) * self.hd, bias=cfg.qkv_bias)
        self.o_proj = RowLinear(self.nh * self.hd, cfg.hidden_size, bias=cfg.o_bias)
        self.scale = self.hd ** -0.5
        self.window = cfg.window_for_layer(layer)
        self.k_cache: torch.Tensor | None = None  # (blocks, block_size, kv_heads, hd), bound later
        self.v_cache: torch.Tensor | None = None
        self.kernels: Kernels | None = None  # CausalLM.use_kernels

    def forward(self, x, cos, sin, meta: AttentionMetadata, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (T, hidden). cos/sin: the positions' angles (Rotary.lookup); with `kernels`, the whole
        tables and `positions` (the rotary kernel looks them up)."""
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        kern = self.kernels
        if kern is not None and positions is not None:
            kern.rotary_(qkv, positions, cos, sin, self.nh + self.kvh, self.hd)
        q, k, v = qkv.split([self.nh * self.hd, self.kvh * self.hd, self.kvh * self.hd], -1)
        q, k, v = q.view(t, self.nh, self.hd), k.view(t, self.kvh, self.hd), v.view(t, self.kvh, self.hd)
        if kern is None or positions is None:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.k_cache is None or self.v_cache is None:
            raise RuntimeError("the model's KV cache is not bound (CausalLM.bind_kv_cache)")
        if kern is None:
            o = paged_attention(q, k, v, self.k_cache, self.v_cache, meta, self.scale, self.window)
        else:
            o = paged_attention(q, k, v, self.k_cache, self.v_cache, meta, self.scale, self.window,
                                kern.write_kv, kern.decode_attention, kern.cached_prefill)
        return self.o_proj(o.reshape(t, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, shard: Shard) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * shard.inter, bias=cfg.mlp_bias)
        self.down_proj = RowLinear(shard.inter, cfg.hidden_size, bias=cfg.mlp_bias)
        self.kernels: Kernels | None = None  # CausalLM.use_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None:
            return self.down_proj(self.kernels.silu_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, shard: Shard) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer, shard)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, shard)
        self.kernels: Kernels | None = None  # CausalLM.use_kernels

    def forward(self, x, cos, sin, meta, residual: torch.Tensor | None = None,
                positions: torch.Tensor | None = None):
        """x + attention + MLP (torch's ops). With `kernels`: x is the previous layer's MLP
        output (the embeddings for the first, `residual` None), `residual` the sum so far, and it
        returns the pair for the next layer, as vLLM's layers do: each residual add fused into
        the norm that follows it."""
        kern = self.kernels
        if kern is None:
            x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta)
            return x + self.mlp(self.post_attention_layernorm(x))
        norm = self.input_layernorm
        h, residual = kern.rms_norm(x, norm.weight, norm.eps, residual)
        h = self.self_attn(h, cos, sin, meta, positions)
        norm = self.post_attention_layernorm
        h, residual = kern.rms_norm(h, norm.weight, norm.eps, residual)
        return self.mlp(h), residual


class Embedding(nn.Embedding):
    """nn.Embedding without its own random init: built on the meta device (build_model), where
    torch's normal_ imports torch._dynamo, 1 s at each worker's start; the loader or init_random
    fills the weights."""

    def reset_parameters(self) -> None:
        pass


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_len: int | None = None, shard: Shard | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.shard = shard or Shard.of(cfg)
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, self.shard) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = Rotary(cfg, max_len or cfg.max_position_embeddings)
        self.kernels: Kernels | None = None

    def use_kernels(self, kernels: Kernels | None) -> None:
        """Run the layers on `kernels` (kernels.py: the Triton set), or torch's ops (None)."""
        self.kernels = kernels
        for layer in self.decoder_layers():
            layer.kernels = layer.self_attn.kernels = layer.mlp.kernels = kernels

    def lm_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def set_reduce(self, reduce) -> None:
        """The group's all-reduce, for every row-parallel layer (tensor parallel only)."""
        for m in self.modules():
            if isinstance(m, RowLinear):
                m.reduce = reduce

    def decoder_layers(self) -> list[DecoderLayer]:
        """`layers`, typed (iterating an nn.ModuleList gives plain Modules)."""
        return [cast(DecoderLayer, layer) for layer in self.layers]

    def bind_kv_cache(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for layer, (k, v) in zip(self.decoder_layers(), layers, strict=True):
            layer.self_attn.k_cache, layer.self_attn.v_cache = k, v

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if self.kernels is not None:
            return self._forward_fused(x, positions, meta, self.kernels)
        cos, sin = self.rotary.lookup(positions)
        for layer in self.layers:
            x = layer(x, cos, sin, meta)
        return self.norm(x)

    def _forward_fused(self, x: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                       kern: Kernels) -> torch.Tensor:
        residual = None
        for layer in self.layers:
            x, residual = layer(x, self.rotary.cos, self.rotary.sin, meta, residual, positions)
        return kern.rms_norm(x, self.norm.weight, self.norm.eps, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        w = self.lm_weight()
        if hidden.device.type == "cpu" and hidden.shape[0] <= FEW_ROWS:
            # for a few rows, CPU torch's hidden @ w.T reads the (vocab x hidden) weight once per
            # row; w @ hidden.T reads it once: small preset, 3 rows, 11.7 ms -> 3.6 ms (1 thread)
            return torch.mm(w, hidden.t()).t().contiguous()
        return F.linear(hidden, w)


def build_model(cfg: ModelConfig, device: str | torch.device, dtype: torch.dtype,
                max_len: int | None = None, shard: Shard | None = None) -> CausalLM:
    """An uninitialised model of `cfg` (a rank's `shard` of it) on `device` in `dtype` (the loader
    or `init_random` fills it)."""
    with torch.device("meta"):
        model = CausalLM(cfg, max_len, shard).to(dtype)  # no memory yet: cast before materialising
    model = model.to_empty(device=device)
    model.rotary.build(device)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def init_random(model: CausalLM, seed: int) -> None:
    """Deterministic random weights: N(0, init_std) matrices and biases at 0, norms at 1.

    Drawn in float32 with a generator on the model's device, parameter by parameter in a fixed
    order, then cast, so a preset gives the same weights at every dtype (up to rounding) on one
    kind of device. Not across kinds: CUDA's generator draws other numbers than the CPU's, so a
    preset on cuda is another model than on cpu (compare a GPU run with a GPU reference). Drawing
    on the CPU and copying would make them one, at the price of drawing 8 B numbers on the CPU
    for llama3-8b at every start. A rank of a tensor-parallel group draws every whole matrix, in
    the same order, and keeps its part: the same model at every tp."""
    device = model.embed_tokens.weight.device
    gen = torch.Generator(device=device).manual_seed(seed)
    cfg, shard = model.cfg, model.shard
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in CausalLM(cfg, 1).named_parameters()}  # the whole model's
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith("bias"):
            p.zero_()
        else:
            whole = torch.empty(shapes[name], dtype=torch.float32, device=device)
            p.copy_(shard.take(cfg, name, whole.normal_(0.0, cfg.init_std, generator=gen)))
