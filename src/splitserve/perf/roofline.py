"""Analytical (roofline) performance model from the model's shape and the hardware's spec.

One instance on `tp` GPUs: a prefill of T batched tokens takes the larger of its FLOPs at a
power-limited MFU that falls with T and its weight and KV bytes at the fitted bandwidth use; a
decode step of b requests holding C KV tokens the larger of its FLOPs and the bytes it reads (the
experts its tokens touch, every cached K/V), plus fitted per-layer and per-request overheads and,
away from the fitted tensor-parallel degree, the difference in all-reduce and all-to-all time.
The constants are `hw.roofline` (catalog/hardware.toml). docs/perf-model.md ("RooflinePerfModel")
has the formulas, the fit and its error against the profile, and the call times; every call is O(1)
float arithmetic on constants precomputed in __init__.
"""

from __future__ import annotations

from splitserve.catalog import HardwareSpec, ModelSpec, RooflineCalibration, load_hardware
from splitserve.errors import UserError
from .mixed import MixedBatching

__all__ = ["RooflinePerfModel", "allreduce_time", "alltoall_time"]

MIN_TIME_S = 1e-5


def allreduce_time(gpus: int, nbytes: float, latency_s: float, link_bytes_per_s: float) -> float:
    """Ring all-reduce of `nbytes` (the tensor each GPU holds) over `gpus` GPUs:
    2 (gpus - 1) steps of latency_s, each GPU sending 2 (gpus - 1) / gpus * nbytes one way
    (ring reduce-scatter + ring all-gather; Thakur, Rabenseifner & Gropp 2005). 0 for one GPU."""
    return 2 * (gpus - 1) * latency_s + 2 * (gpus - 1) / gpus * nbytes / link_bytes_per_s


def alltoall_time(gpus: int, nbytes: float, latency_s: float, link_bytes_per_s: float) -> float:
    """Pairwise-exchange all-to-all in which each GPU sends (and receives) `nbytes` in all:
    gpus - 1 steps of latency_s plus nbytes one way (Thakur et al. 2005). 0 for one GPU."""
    return (gpus - 1) * latency_s + (nbytes / link_bytes_per_s if gpus > 1 else 0.0)


def _comm_per_layer(model: ModelSpec, gpus: int, ep: int, latency_s: float,
                    link_bytes_per_s: float) -> tuple[float, float]:
    """Tensor-parallel communication of one layer as (fixed s, s per token in the pass): the
    all-reduces after attention and after the MLP; with expert parallelism (ep > 1) the MoE MLP's
    all-reduce becomes a dispatch and a combine all-to-all of k copies of each token, the
    (ep - 1) / ep of them whose expert sits on another GPU."""
    x = float(model.hidden * model.dtype_bytes)          # bytes per token of one activation
    ar0 = allreduce_time(gpus, 0.0, latency_s, link_bytes_per_s)
    ar1 = allreduce_time(gpus, x, 0.0, link_bytes_per_s)
    if ep == 1:
        return 2.0 * ar0, 2.0 * ar1
    y = model.experts_per_token * x * (ep - 1) / ep
    a2a0 = alltoall_time(ep, 0.0, latency_s, link_bytes_per_s)
    a2a1 = alltoall_time(ep, y, 0.0, link_bytes_per_s)
    return ar0 + 2.0 * a2a0, ar1 + 2.0 * a2a1


def _check(model: ModelSpec, hw: HardwareSpec, tp: int, ep: int, c: RooflineCalibration) -> None:
    """The parallelism and the calibration a roofline model takes (UserError names what is wrong)."""
    if not 1 <= tp <= hw.gpus:
        raise UserError(f"tensor parallel {tp} must be between 1 and {hw.gpus} on {hw.name}")
    # ep < tp would split each expert over tp / ep GPUs, which needs an all-reduce inside
    # each expert group on top of the all-to-alls: not modelled, so refused
    if ep != 1 and not (model.is_moe and ep == tp and model.experts % ep == 0):
        raise UserError(
            f"expert parallel {ep} needs a mixture-of-experts model, must equal tensor "
            f"parallel {tp} (experts spread over all the instance's GPUs) and divide "
            f"{model.name}'s {model.experts} experts"
        )
    if not (0.0 < c.mfu_large <= c.mfu <= 1.0 and 0.0 < c.mbu <= 1.0
            and c.mfu_knee_tokens > 0.0 and c.prompt_cap_slowdown > 0.0):
        raise UserError(
            f"roofline constants of {hw.name} are not calibrated (need "
            f"0 < mfu_large <= mfu <= 1, 0 < mbu <= 1, mfu_knee_tokens > 0)"
        )


class RooflinePerfModel(MixedBatching):
    __slots__ = (
        "source", "model", "hw", "tp", "ep", "calibration",
        "_s_cap", "_o_p", "_c_p", "_pa1", "_pa2", "_inv_mfu", "_inv_drop", "_knee", "_pm0", "_pm1",
        "_o_t", "_o_seq", "_da1", "_da2", "_dm0", "_dm1", "_dmq", "_q", "_comm0", "_comm1",
    )

    def __init__(
        self,
        model: ModelSpec,
        hw: HardwareSpec,
        tp: int | None = None,
        calibration: RooflineCalibration | None = None,
        ep: int = 1,
    ) -> None:
        tp = hw.gpus if tp is None else tp
        c = hw.roofline if calibration is None else calibration
        _check(model, hw, tp, ep, c)
        self.source = "roofline"
        self.model, self.hw, self.tp, self.ep, self.calibration = model, hw, tp, ep, c
        peak = tp * hw.bf16_tflops * 1e12               # FLOP/s
        bw = tp * hw.hbm_bw_gbs * 1e9 * c.mbu           # achieved bytes/s
        layers = model.layers
        attn = layers * model.heads * model.head_dim
        active = float(model.active_params)             # = params for a dense model
        w = float(model.weight_bytes)                   # every expert
        kv = float(model.kv_bytes_per_token)
        # all-reduce difference from the fit: the overheads were fitted at tp = the fitted
        # machine's GPU count, ep 1, so they already hold that many GPUs' all-reduces on its links
        ref = (c.fitted_ref or load_hardware(c.fitted_on)) if c.fitted_on else hw
        now0, now1 = _comm_per_layer(model, tp, ep, hw.nvlink_latency_s, hw.link_bytes_per_s)
        fit0, fit1 = _comm_per_layer(model, ref.gpus, 1, ref.nvlink_latency_s,
                                     ref.link_bytes_per_s)
        self._comm0 = layers * (now0 - fit0)            # s per iteration (0.0 at the fit's tp)
        self._comm1 = layers * (now1 - fit1)            # s per token in the pass
        # prompt: compute = (pa1 + pa2 T) T (inv_mfu + inv_mfu_drop T / (T + knee))
        self._s_cap = c.prompt_cap_slowdown
        self._o_p = layers * c.prompt_layer_overhead_s + self._comm0
        # per prompt token: extra communication (slower links or more GPUs than the fit) adds to
        # the iteration, max(comp, mem) + c T = max(comp + c T, mem + c T); a saving (c < 0) can
        # only come out of the per-token work the fit's all-reduces were part of, the compute side
        # (off the memory side too, memory-bound prefills would shorten as they grow)
        self._c_p = self._comm1                         # added to comp
        c_mem = self._comm1 if self._comm1 > 0.0 else 0.0   # added to mem
        self._pa1 = 2.0 * active / peak
        self._pa2 = 2.0 * attn / peak
        self._inv_mfu = 1.0 / c.mfu
        self._inv_drop = 1.0 / c.mfu_large - 1.0 / c.mfu
        self._knee = c.mfu_knee_tokens
        self._pm0 = w / bw                              # a prefill reads every weight once
        self._pm1 = kv / bw + c_mem
        # decode: compute = da1 b + da2 C; memory = dm0 - dmq q^b + dm1 C
        self._o_t = layers * c.token_layer_overhead_s + self._comm0
        o_seq = layers * c.token_seq_layer_overhead_s + self._comm1
        self._o_seq = o_seq if o_seq > 0.0 else 0.0     # a saving stops at a free request
        self._da1 = 2.0 * active / (peak * c.mfu)
        self._da2 = 4.0 * attn / (peak * c.mfu)
        self._dm0 = w / bw
        self._dm1 = kv / bw
        # MoE: b tokens each picking k of E experts leave q^b of every expert untouched,
        # q = 1 - k/E; those weights are not read (dense: dmq = 0, nothing subtracted)
        self._q = 1.0 - model.experts_per_token / model.experts
        self._dmq = model.expert_params * model.dtype_bytes / bw

    def prompt_time(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        comp = (self._pa1 + self._pa2 * tokens) * tokens * (
            self._inv_mfu + self._inv_drop * tokens / (tokens + self._knee)
        ) + self._c_p * tokens
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
        if self._dmq:
            mem -= self._dmq * self._q ** batch
        t = self._o_t + self._o_seq * batch + (comp if comp > mem else mem)
        return t if t > MIN_TIME_S else MIN_TIME_S

    def decode_bytes(self, batch: int, context: int) -> float:
        """Bytes one decode iteration reads: shared weights, the experts the batch touches
        (expected E (1 - (1 - k/E)^b) of E per layer), and `context` tokens of K/V."""
        m = self.model
        touched = m.expert_params * (1.0 - self._q ** batch) if m.is_moe else 0.0
        return (m.shared_params + touched) * m.dtype_bytes + context * m.kv_bytes_per_token

    def comm_time(self, tokens: int) -> float:
        """Tensor/expert-parallel communication of one pass over `tokens` tokens, as the
        difference from what the fitted overheads hold (0 at the fit's tp, may be negative)."""
        return self._comm0 + self._comm1 * tokens

    def __repr__(self) -> str:
        ep = f", ep={self.ep}" if self.ep != 1 else ""
        return (f"RooflinePerfModel(model={self.model.name!r}, hw={self.hw.name!r}, "
                f"tp={self.tp}{ep})")
