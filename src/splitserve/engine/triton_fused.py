"""The decoder layer's elementwise work as Triton kernels, one launch each where torch takes
several (docs/architecture.md, engine/): RMSNorm with the residual add, rotary on q and k in place,
SiLU-and-multiply, and the KV-cache write.

Each kernel computes what model.py's torch code computes, rounding where it rounds: a 16-bit
input is widened to float32, and a result is narrowed to the model's dtype exactly where torch's
op would store it (the residual sum, the normalised row before the weight, SiLU's output), so on
a bf16 model the two agree to the last bit but for summation order (the norm's mean) and the
GPU's fused multiply-adds. Runs on CUDA, and on CPU tensors under Triton's interpreter
(TRITON_INTERPRET=1), where the tests compare each with the torch op it replaces.

The interpreter narrows float32 to bfloat16 by truncation where the GPU (and torch) round to
nearest even; `narrow` rounds first when told it runs there (EMULATE: the tensors are on the CPU),
so the interpreter computes what the GPU does. It has no bfloat16 arithmetic either (numpy lacks
the type): every kernel computes in float32.
"""

from __future__ import annotations

import torch
import triton  # type: ignore[import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-untyped,unused-ignore]


@triton.jit
def narrow(x, dtype: tl.constexpr, EMULATE: tl.constexpr):
    """float32 x to `dtype`, rounded to nearest even (on the GPU, the conversion's own rounding;
    in the interpreter, EMULATE, rounded here first for bfloat16: its cast truncates)."""
    if EMULATE and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


def emulate(x: torch.Tensor) -> bool:
    """The kernel runs in Triton's interpreter (CPU tensors): `narrow` rounds for itself."""
    return x.device.type == "cpu"


@triton.jit
def _rms_norm_kernel(X, R, W, Y, RO, n, eps, sx, sr, sy, sro,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, EMULATE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    dt = Y.dtype.element_ty
    x = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x = x + tl.load(R + row * sr + cols, mask=mask, other=0.0).to(tl.float32)
        x = narrow(x, dt, EMULATE)
        tl.store(RO + row * sro + cols, x, mask=mask)
        x = x.to(tl.float32)
    r = 1.0 / tl.sqrt_rn(tl.sum(x * x, 0) / n + eps)
    h = narrow(x * r, dt, EMULATE).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * sy + cols, narrow(w * h, dt, EMULATE), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(s), s) with s = x + residual (x alone without one): model.py's
    `x = x + f(...)` then `RMSNorm(x)` in one pass. x, residual (T, n) -> two (T, n)."""
    t, n = x.shape
    if x.stride(-1) != 1 or weight.stride(-1) != 1 or (residual is not None and residual.stride(-1) != 1):
        raise ValueError("rms_norm reads unit-stride rows")
    y = torch.empty_like(x)
    s = x if residual is None else torch.empty_like(x)
    r = x if residual is None else residual
    if t:
        _rms_norm_kernel[(t,)](x, r, weight, y, s, n, eps, x.stride(0), r.stride(0), y.stride(0), s.stride(0),
                               HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(n),
                               EMULATE=emulate(x))
    return y, s


@triton.jit
def _rotary_kernel(QKV, P, COS, SIN, sq, sc, HALF: tl.constexpr, BLOCK: tl.constexpr, EMULATE: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)  # q heads, then k heads: contiguous in the fused qkv row
    i = tl.arange(0, BLOCK)
    mask = i < HALF
    pos = tl.load(P + row).to(tl.int64)
    cos = tl.load(COS + pos * sc + i, mask=mask, other=0.0)
    sin = tl.load(SIN + pos * sc + i, mask=mask, other=0.0)
    base = QKV + row * sq + head * (2 * HALF)
    x1 = tl.load(base + i, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF + i, mask=mask, other=0.0).to(tl.float32)
    dt = QKV.dtype.element_ty
    tl.store(base + i, narrow(x1 * cos - x2 * sin, dt, EMULATE), mask=mask)
    tl.store(base + HALF + i, narrow(x2 * cos + x1 * sin, dt, EMULATE), mask=mask)


def rotary_(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            heads: int, head_dim: int) -> None:
    """Rotate, in place, the first `heads` heads (the q and k heads) of each fused qkv row
    (T, (q_heads + 2 kv_heads) * head_dim) by its position's angles: model.apply_rotary on q and k.
    cos/sin: the float32 tables (max_len, head_dim / 2), indexed here by `positions` (T,)."""
    t = qkv.shape[0]
    if qkv.stride(-1) != 1 or cos.stride(-1) != 1 or cos.dtype != torch.float32:
        raise ValueError("rotary_ needs unit-stride rows and float32 tables")
    half = head_dim // 2
    if t:
        _rotary_kernel[(t, heads)](qkv, positions, cos, sin, qkv.stride(0), cos.stride(0),
                                   HALF=half, BLOCK=triton.next_power_of_2(half), EMULATE=emulate(qkv))


@triton.jit
def _silu_mul_kernel(GU, O, n, sg, so, BLOCK: tl.constexpr, EMULATE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(GU + row * sg + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * sg + n + cols, mask=mask, other=0.0).to(tl.float32)
    dt = O.dtype.element_ty
    s = narrow(g / (1.0 + tl.exp(-g)), dt, EMULATE).to(tl.float32)
    tl.store(O + row * so + cols, narrow(s * u, dt, EMULATE), mask=mask)


SILU_BLOCK = 1024


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of the fused (T, 2n) gate_up rows -> (T, n): model.MLP's activation."""
    t, two_n = gate_up.shape
    if gate_up.stride(-1) != 1:
        raise ValueError("silu_mul reads unit-stride rows")
    n = two_n // 2
    out = torch.empty(t, n, dtype=gate_up.dtype, device=gate_up.device)
    if t:
        _silu_mul_kernel[(t, triton.cdiv(n, SILU_BLOCK))](gate_up, out, n, gate_up.stride(0), out.stride(0),
                                                          BLOCK=SILU_BLOCK, EMULATE=emulate(out))
    return out


@triton.jit
def _write_kv_kernel(K, V, KC, VC, S, sk, sv, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    slot = tl.load(S + row).to(tl.int64)
    tl.store(KC + slot * n + cols, tl.load(K + row * sk + cols, mask=mask), mask=mask)
    tl.store(VC + slot * n + cols, tl.load(V + row * sv + cols, mask=mask), mask=mask)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """attention.write_kv in one launch: rows (T, kv_heads, head_dim), each row's heads adjacent
    (a view into the fused qkv output is fine), to their slots of the contiguous caches."""
    t, kvh, hd = k.shape
    n = kvh * hd
    for x in (k, v):
        if x.stride(2) != 1 or x.stride(1) != hd:
            raise ValueError(f"write_kv needs each row's {kvh}x{hd} K/V adjacent, got strides {x.stride()}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("write_kv writes into contiguous caches")
    if t:
        _write_kv_kernel[(t,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0), n,
                               BLOCK=triton.next_power_of_2(n))
