"""Analytical (roofline) performance model from model shape and hardware spec.

For one model instance on `tp` GPUs of a machine, with P = tp * peak dense bf16 FLOP/s,
BW = tp * HBM bytes/s, L layers, W weight bytes, kv KV bytes per token, and the fitted constants
of `hw.roofline` (see docs/perf-model.md for the fit and its error):

  prompt_time(T) = s_cap * (L * o_p + max(F_p(T) / (P * mfu(T)), (W + T * kv) / (BW * mbu)))
      F_p(T) = 2 * params * T + 2 * L * heads * head_dim * T^2
          dense matmuls, plus causal attention (QK^T and AV, each T^2/2 * head_dim per head)
          over ONE prompt of T tokens: an upper bound when T is several shorter prompts,
          < 2% of F_p for llama2-70b up to T = 2048 (Splitwise's prompt batch cap).
      1 / mfu(T) = 1 / mfu + (1 / mfu_large - 1 / mfu) * T / (T + T_knee)
          prompt throughput peaks near 2048 batched tokens and then falls (paper Fig. 6a); the
          profile's power columns reach TDP at the same size (paper Fig. 8a), so we model the
          large-batch loss as a lower, power-limited MFU.
      s_cap: prompt-phase slowdown under a GPU power cap (paper Fig. 9a; 1.0 uncapped).
  token_time(b, C) = L * (o_t + b * o_s) + max(F_d / (P * mfu), (W + C * kv) / (BW * mbu))
      F_d = 2 * params * b + 4 * L * heads * head_dim * C     (matmuls + attention over C)
      W + C * kv: every weight and every cached K/V byte is read once per iteration.
      L * o_t: per-layer fixed cost (kernel launches, tensor-parallel all-reduces);
      L * b * o_s: per-layer, per-request cost (attention kernels, sampling bookkeeping).
      The power cap does not slow decoding (paper Fig. 9b; the profile agrees).
  mixed_time: the same composition rule as ProfilePerfModel.

C is the KV tokens of the whole batch. Calls are O(1) pure-Python float arithmetic, measured
with `python -m timeit` on the development machine (AMD EPYC, Python 3.11.7): prompt_time
0.31 us, token_time 0.24 us, mixed_time 0.62 us per call.
"""

from __future__ import annotations

from splitserve.catalog import HardwareSpec, ModelSpec, RooflineCalibration
from splitserve.errors import UserError
from .mixed import MixedBatching

__all__ = ["RooflinePerfModel"]

MIN_TIME_S = 1e-5


class RooflinePerfModel(MixedBatching):
    __slots__ = (
        "source", "model", "hw", "tp", "calibration",
        "_s_cap", "_o_p", "_pa1", "_pa2", "_inv_mfu", "_inv_drop", "_knee", "_pm0", "_pm1",
        "_o_t", "_o_seq", "_da1", "_da2", "_dm0", "_dm1",
    )

    def __init__(
        self,
        model: ModelSpec,
        hw: HardwareSpec,
        tp: int | None = None,
        calibration: RooflineCalibration | None = None,
    ) -> None:
        if tp is None:
            tp = hw.gpus
        if not 1 <= tp <= hw.gpus:
            raise UserError(f"tensor parallel {tp} must be between 1 and {hw.gpus} on {hw.name}")
        c = hw.roofline if calibration is None else calibration
        if not (0.0 < c.mfu_large <= c.mfu <= 1.0 and 0.0 < c.mbu <= 1.0
                and c.mfu_knee_tokens > 0.0 and c.prompt_cap_slowdown > 0.0):
            raise UserError(
                f"roofline constants of {hw.name} are not calibrated (need "
                f"0 < mfu_large <= mfu <= 1, 0 < mbu <= 1, mfu_knee_tokens > 0)"
            )
        self.source = "roofline"
        self.model, self.hw, self.tp, self.calibration = model, hw, tp, c
        peak = tp * hw.bf16_tflops * 1e12               # FLOP/s
        bw = tp * hw.hbm_bw_gbs * 1e9 * c.mbu           # achieved bytes/s
        layers = model.layers
        attn = layers * model.heads * model.head_dim
        w = float(model.weight_bytes)
        kv = float(model.kv_bytes_per_token)
        # prompt: compute = (pa1 + pa2 T) T (inv_mfu + inv_mfu_drop T / (T + knee))
        self._s_cap = c.prompt_cap_slowdown
        self._o_p = layers * c.prompt_layer_overhead_s
        self._pa1 = 2.0 * model.params / peak
        self._pa2 = 2.0 * attn / peak
        self._inv_mfu = 1.0 / c.mfu
        self._inv_drop = 1.0 / c.mfu_large - 1.0 / c.mfu
        self._knee = c.mfu_knee_tokens
        self._pm0 = w / bw
        self._pm1 = kv / bw
        # decode: compute = da1 b + da2 C; memory = dm0 + dm1 C
        self._o_t = layers * c.token_layer_overhead_s
        self._o_seq = layers * c.token_seq_layer_overhead_s
        self._da1 = 2.0 * model.params / (peak * c.mfu)
        self._da2 = 4.0 * attn / (peak * c.mfu)
        self._dm0 = w / bw
        self._dm1 = kv / bw

    def prompt_time(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        comp = (self._pa1 + self._pa2 * tokens) * tokens * (
            self._inv_mfu + self._inv_drop * tokens / (tokens + self._knee)
        )
        mem = self._pm0 + self._pm1 * tokens
        t = self._s_cap * (self._o_p + (comp if comp > mem else mem))
        return t if t > MIN_TIME_S else MIN_TIME_S

    def token_time(self, batch: int, context: int) -> float:
        if batch <= 0:
            return 0.0
        if context < 0:
            context = 0
        comp = self._da1 * batch + self._da2 * context
        mem = self._dm0 + self._dm1 * context
        t = self._o_t + self._o_seq * batch + (comp if comp > mem else mem)
        return t if t > MIN_TIME_S else MIN_TIME_S

    def __repr__(self) -> str:
        return f"RooflinePerfModel(model={self.model.name!r}, hw={self.hw.name!r}, tp={self.tp})"
