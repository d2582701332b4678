"""An operator-level model of a transformer layer's non-attention time, fitted on measured profiles.

Each token-level operator of one layer (projections, norms, activation, residual add) takes
`c0 + bytes * c1` (elementwise) or `c0 + bytes * c1 + flops * c2 + wave_work * c3` (GEMM)
milliseconds on one tensor-parallel worker, where the features come from the model's shape,
the TP degree and the batch's token count:

- `bytes`: fp16 bytes the operator reads and writes (activations in and out, plus the weight
  shard for a GEMM): the memory-bound part, 1/c1 an effective bandwidth;
- `flops`: 2 * tokens * n * k of the worker's GEMM shard, 1/c2 a sustained FLOP rate;
- `wave_work`: the same GEMM counted in whole waves of 128x128 output tiles over the GPU's SMs
  (`ceil(tiles / sms) * 128 * 128 * 2 * k`): tile and wave quantization, which small shards pay.

Coefficients are non-negative, so a prediction never falls when tokens grow. TP all-reduce
(two per layer when tp > 1) is `latency + bytes * per_byte` per worker count. The numbers live
in `data/operator_model.json`, fitted by scripts/fit_operator_model.py on Vidur's published
A100/H100 profiles (microsoft/vidur commit 7d47513, MIT); this module never reads the profiles.
Attention is not modelled here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from splitserve.errors import UserError

TILE = 128
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
"""The operators of one layer outside attention, as Vidur profiles them (`emb` is per model)."""
ALL_OPS = ("emb",) + LAYER_OPS


@dataclass(frozen=True)
class LayerShape:
    """What the operator times depend on: a decoder layer's dimensions (fp16 weights)."""

    n_head: int
    n_kv_head: int
    n_embd: int
    n_expanded_embd: int
    gated_mlp: bool = True
    post_attention_norm: bool = True  # False for parallel-residual layers (phi-2): one norm

    def layer_ops(self) -> tuple[str, ...]:
        return LAYER_OPS if self.post_attention_norm else tuple(o for o in LAYER_OPS if o != "post_attention_layernorm")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def gemm_dims(op: str, s: LayerShape, tp: int) -> tuple[int, int]:
    """(n, k) of one worker's shard of a GEMM operator: output columns and reduction length."""
    if op == "attn_pre_proj":
        return (s.n_head + 2 * s.n_kv_head) * s.head_dim // tp, s.n_embd
    if op == "attn_post_proj":
        return s.n_embd, s.n_embd // tp
    if op == "mlp_up_proj":
        return (2 if s.gated_mlp else 1) * s.n_expanded_embd // tp, s.n_embd
    if op == "mlp_down_proj":
        return s.n_embd, s.n_expanded_embd // tp
    raise UserError(f"{op!r} is not a GEMM operator; use one of {', '.join(GEMM_OPS)}")


def elementwise_elems(op: str, s: LayerShape, tp: int, tokens: int) -> int:
    """fp16 elements an elementwise operator reads plus writes on one worker."""
    if op in ("input_layernorm", "post_attention_layernorm"):
        return 2 * tokens * s.n_embd
    if op == "add":
        return 3 * tokens * s.n_embd
    if op == "emb":
        return 2 * tokens * s.n_embd
    if op == "attn_rope":
        return 2 * tokens * (s.n_head + s.n_kv_head) * s.head_dim // tp
    if op == "mlp_act":
        inner = s.n_expanded_embd // tp
        return tokens * inner * (3 if s.gated_mlp else 2)
    raise UserError(f"unknown operator {op!r}; use one of {', '.join(ALL_OPS)}")


def features(op: str, s: LayerShape, tp: int, tokens: int, sms: int) -> list[float]:
    """The regressors of one operator's time: [1, bytes] or, for a GEMM, [1, bytes, flops, wave_work]."""
    if tokens < 1 or tp < 1:
        raise UserError(f"tokens and tp must be >= 1 (got tokens={tokens}, tp={tp})")
    if op in GEMM_OPS:
        n, k = gemm_dims(op, s, tp)
        nbytes = 2.0 * (tokens * k + k * n + tokens * n)
        tiles = math.ceil(tokens / TILE) * math.ceil(n / TILE)
        waves = math.ceil(tiles / sms)
        return [1.0, nbytes, 2.0 * tokens * n * k, waves * TILE * TILE * 2.0 * k]
    return [1.0, 2.0 * elementwise_elems(op, s, tp, tokens)]


@dataclass(frozen=True)
class GpuCoefficients:
    """One GPU's fitted numbers: SM count, per-operator coefficients, all-reduce per worker count."""

    sms: int
    ops: dict[str, list[float]]
    all_reduce: dict[int, tuple[float, float]]


class OperatorModel:
    """Predicts operator and layer times (ms) on the GPUs in the fitted coefficients."""

    def __init__(self, gpus: dict[str, GpuCoefficients]) -> None:
        self.gpus = gpus

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "OperatorModel":
        gpus = {}
        for name, g in data["gpus"].items():
            ar = {int(w): (float(v[0]), float(v[1])) for w, v in g["all_reduce"].items()}
            gpus[name] = GpuCoefficients(int(g["sms"]), {k: list(v) for k, v in g["ops"].items()}, ar)
        return cls(gpus)

    def _gpu(self, gpu: str) -> GpuCoefficients:
        try:
            return self.gpus[gpu.lower()]
        except KeyError:
            raise UserError(f"no operator model for GPU {gpu!r}; use one of {', '.join(sorted(self.gpus))}") from None

    def op_ms(self, gpu: str, op: str, shape: LayerShape, tp: int, tokens: int) -> float:
        """One operator's time on one worker, in milliseconds."""
        g = self._gpu(gpu)
        if op not in g.ops:
            raise UserError(f"unknown operator {op!r}; use one of {', '.join(ALL_OPS)}")
        x = features(op, shape, tp, tokens, g.sms)
        return sum(c * f for c, f in zip(g.ops[op], x))

    def all_reduce_ms(self, gpu: str, workers: int, elements: int) -> float:
        """One all-reduce of `elements` fp16 values across `workers` GPUs of one node, in ms."""
        if workers <= 1:
            return 0.0
        g = self._gpu(gpu)
        if workers not in g.all_reduce:
            raise UserError(f"no all-reduce fit for {workers} workers on {gpu}; use one of {sorted(g.all_reduce)}")
        lat, per_byte = g.all_reduce[workers]
        return lat + per_byte * 2.0 * elements

    def layer_compute_ms(self, gpu: str, shape: LayerShape, tp: int, tokens: int) -> float:
        """Sum of one layer's non-attention operators on one worker (no communication)."""
        return sum(self.op_ms(gpu, op, shape, tp, tokens) for op in shape.layer_ops())

    def layer_ms(self, gpu: str, shape: LayerShape, tp: int, tokens: int) -> float:
        """One layer's non-attention time: its operators plus the two TP all-reduces."""
        comm = 2 * self.all_reduce_ms(gpu, tp, tokens * shape.n_embd)
        return self.layer_compute_ms(gpu, shape, tp, tokens) + comm


@lru_cache(maxsize=1)
def load() -> OperatorModel:
    """The committed coefficients (package data)."""
    text = resources.files("splitserve.perf").joinpath("data/operator_model.json").read_text()
    return OperatorModel.from_dict(json.loads(text))
