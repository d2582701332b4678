"""The operator-level performance model: a whole step's time built from its operators, for any
(model, GPU, tp) the operator fit covers, not only the Splitwise profile's grid.

A step is the sum of one layer's operators (perf/operators.py, fitted on Vidur's A100/H100
operator profiles; an MoE layer runs the experts its tokens touch) over L layers, plus the
embedding and the LM head, plus what a measured step costs beyond its operators: O per step
(kernel launches, host work, collective latency), o_seq per decode request per layer, and a
prefill slowdown S(T) that grows with the prompt tokens (power-limited clocks, paper Fig. 8a).
Decodes add their KV reads, prefills their attention (perf/mixed.py). O, S and o_seq
(`data/step_overheads.json`) are fitted by scripts/fit_step_overheads.py on the Splitwise
authors' llama2-70b steps; docs/perf-model.md ("The operator step model") has the formulas, the
fit and its held-out errors. A call is a dict lookup of the token count's operator sum (computed
once per count) and a few float operations.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from typing import Any

from splitserve.catalog import HardwareSpec, ModelSpec
from splitserve.errors import UserError
from .mixed import MixedBatching
from .operators import LayerShape, OperatorModel, features, load

__all__ = ["OperatorPerfModel", "operator_gpu", "load_step_overheads"]

MIN_TIME_S = 1e-5
MLP_OPS = ("mlp_up_proj", "mlp_act", "mlp_down_proj")
ATTN_RATE_TOKENS = 4096


@lru_cache(maxsize=1)
def load_step_overheads() -> dict[str, Any]:
    """The committed step coefficients per GPU (package data), with the GPU names they cover."""
    text = resources.files("splitserve.perf").joinpath("data/step_overheads.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def operator_gpu(hw: HardwareSpec) -> str | None:
    """The operator fit's name for `hw`'s GPU (a100, h100), None when neither fit covers it."""
    gpu: str | None = load_step_overheads()["gpus_by_name"].get(hw.gpu)
    return gpu


def layer_shape(model: ModelSpec) -> LayerShape:
    return LayerShape(model.heads, model.kv_heads, model.hidden, model.intermediate,
                      gated_mlp=model.mlp == "swiglu")


class OperatorPerfModel(MixedBatching):
    __slots__ = ("source", "model", "hw", "tp", "gpu", "attention", "_ops", "_shape", "_head", "_layer_ops",
                 "_gpu_coef", "_o", "_s", "_knee", "_o_seq", "_kv", "_s_cap", "_L", "_pcache", "_dcache")

    def __init__(self, model: ModelSpec, hw: HardwareSpec, tp: int | None = None,
                 ops: OperatorModel | None = None, step: dict[str, float] | None = None) -> None:
        """`ops` / `step`: the operator fit and the step coefficients ({o_layer, o_ar, s0, s1,
        knee, o_seq}, seconds); the committed ones when None (fit_step_overheads.py passes zeros)."""
        tp = hw.gpus if tp is None else tp
        gpu = operator_gpu(hw)
        if gpu is None:
            raise UserError(f"no operator model for {hw.name}'s GPU {hw.gpu!r}; the fit covers "
                            f"{', '.join(sorted(load_step_overheads()['gpus_by_name']))}")
        if not 1 <= tp <= hw.gpus:
            raise UserError(f"tensor parallel {tp} must be between 1 and {hw.gpus} on {hw.name}")
        if model.heads % tp:
            raise UserError(f"tensor parallel {tp} must divide {model.name}'s {model.heads} attention heads")
        self.source = "operators"
        self.model, self.hw, self.tp, self.gpu = model, hw, tp, gpu
        self._ops = ops if ops is not None else load()
        self._gpu_coef = self._ops.gpus[gpu]
        self._shape = layer_shape(model)
        self._head = LayerShape(1, 1, model.hidden, model.vocab, gated_mlp=False)
        skip = {"attn_rope"} if model.positions != "rope" else set()
        self._layer_ops = tuple(o for o in self._shape.layer_ops() if o not in skip)
        c = load_step_overheads()["gpus"][gpu] if step is None else step
        L = self._L = model.layers
        self._o = L * (c["o_layer"] + c["o_ar"] * (tp - 1))
        self._s = max(0.0, c["s0"] + c["s1"] * math.log2(tp))
        self._knee = c["knee"]
        self._o_seq = L * c["o_seq"]
        self._s_cap = hw.roofline.prompt_cap_slowdown
        kv_heads = -(-model.kv_heads // tp)
        one = self._gemm_ms(self._shape, 1)
        kv_bw = features("mlp_up_proj", self._shape, tp, 1, self._gpu_coef.sms)[1] / one   # bytes per ms
        self._kv = L * 2.0 * kv_heads * model.head_dim * model.dtype_bytes / kv_bw * 1e-3   # s per token
        flops = features("mlp_up_proj", self._shape, tp, ATTN_RATE_TOKENS, self._gpu_coef.sms)[2]
        rate = flops / self._gemm_ms(self._shape, ATTN_RATE_TOKENS)                      # FLOP per ms
        self.attention = self._s_cap * L * 2.0 * model.hidden / tp / rate * 1e-3
        self._pcache: dict[int, float] = {}
        self._dcache: dict[int, float] = {}

    def _gemm_ms(self, shape: LayerShape, tokens: int) -> float:
        x = features("mlp_up_proj", shape, self.tp, tokens, self._gpu_coef.sms)
        return sum(c * f for c, f in zip(self._gpu_coef.ops["mlp_up_proj"], x))

    def _op(self, op: str, tokens: int) -> float:
        return self._ops.op_ms(self.gpu, op, self._shape, self.tp, tokens)

    def layer_ms(self, tokens: int) -> float:
        """One layer's operators and all-reduces on one worker at `tokens` tokens (ms)."""
        m = self.model
        t = 2 * self._ops.all_reduce_ms(self.gpu, self.tp, tokens * m.hidden)
        for op in self._layer_ops:
            if m.is_moe and op in MLP_OPS:
                touched = m.experts * (1.0 - (1.0 - m.experts_per_token / m.experts) ** tokens)
                t += touched * self._op(op, max(1, math.ceil(tokens * m.experts_per_token / touched)))
            else:
                t += self._op(op, tokens)
        return t

    def _pass_ms(self, tokens: int, seqs: int) -> float:
        """Every layer's operators, the embedding and the LM head over `seqs` sequences (ms)."""
        return (self._L * self.layer_ms(tokens) + self._op("emb", tokens) + self._gemm_ms(self._head, seqs))

    def prompt_time(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        t = self._pcache.get(tokens)
        if t is None:
            slow = 1.0 + self._s * tokens / (tokens + self._knee)
            t = self._s_cap * (self._o + slow * self._pass_ms(tokens, 1) * 1e-3)
            self._pcache[tokens] = t
        return t if t > MIN_TIME_S else MIN_TIME_S

    def token_time(self, batch: int, context: int) -> float:
        if batch <= 0:
            return 0.0
        t = self._dcache.get(batch)
        if t is None:
            t = self._o + self._o_seq * batch + self._pass_ms(batch, batch) * 1e-3
            self._dcache[batch] = t
        if context > 0:
            t += self._kv * context
        return t if t > MIN_TIME_S else MIN_TIME_S

    def __repr__(self) -> str:
        return f"OperatorPerfModel(model={self.model.name!r}, hw={self.hw.name!r}, tp={self.tp})"

