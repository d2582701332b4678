"""Memory arithmetic of one model instance: the activation reserve and the tokens of KV cache
left once the weights and the reserve are in HBM."""

from __future__ import annotations

from splitserve.errors import UserError

from .hardware import HardwareSpec
from .model import ModelSpec


def activation_reserve_bytes(model: ModelSpec, tp: int, tokens: int | None = None) -> int:
    """Memory held back for activations when sizing the KV cache, all `tp` GPUs together.

    The serving engine sizes its KV cache after a profiling forward pass over the largest batch
    it will run (vLLM does exactly this), so the reserve is the peak live activation set of one
    pass over `tokens` tokens (default: `model.max_context`, one longest prompt), per GPU:
    the residual stream and the normalised layer input (2 * hidden, replicated on every GPU),
    the layer's own Q, K, V (heads + 2 * kv_heads) * head_dim / tp, and the MLP's two
    up-projections 2 * intermediate / tp (each of the experts_per_token experts a token is routed to,
    for a mixture of experts); times dtype_bytes, times tp GPUs. Framework and CUDA
    overheads are covered by `memory_utilization` < 1, not here.
    """
    if tokens is None:
        tokens = model.max_context
    per_gpu_per_token = (
        2 * model.hidden
        + (model.heads + 2 * model.kv_heads) * model.head_dim // tp
        + 2 * model.intermediate * model.experts_per_token // tp
    ) * model.dtype_bytes
    return tp * tokens * per_gpu_per_token


def kv_capacity_tokens(
    model: ModelSpec,
    hw: HardwareSpec,
    tp: int | None = None,
    memory_utilization: float = 0.9,
    pp: int = 1,
) -> int:
    """Tokens of KV cache one model instance holds.

    (tp * pp * HBM * memory_utilization - weights - pp * activation reserve) / kv_bytes_per_token,
    rounded down. The instance runs on `tp` GPUs of one machine (default: all of them) in each of
    `pp` pipeline stages; every stage holds its own activations, and the weights and the KV of a
    token are spread over the stages. Raises UserError when the weights and the reserve do not fit.
    """
    if tp is None:
        tp = hw.gpus
    if not 1 <= tp <= hw.gpus:
        raise UserError(f"tensor parallel {tp} must be between 1 and {hw.gpus} on {hw.name}")
    if pp < 1:
        raise UserError(f"pipeline stages must be at least 1, got {pp}")
    if not 0.0 < memory_utilization <= 1.0:
        raise UserError(f"memory_utilization {memory_utilization} must be in (0, 1]")
    usable = tp * pp * hw.hbm_gb * 1e9 * memory_utilization
    free = usable - model.weight_bytes - pp * activation_reserve_bytes(model, tp)
    if free <= 0:
        raise UserError(
            f"{model.name} ({model.weight_bytes / 1e9:.0f} GB of weights) does not fit on "
            f"{tp * pp} GPUs (tp {tp} x pp {pp}) of {hw.name} ({usable / 1e9:.0f} GB usable at "
            f"memory_utilization={memory_utilization})"
        )
    return int(free // model.kv_bytes_per_token)
