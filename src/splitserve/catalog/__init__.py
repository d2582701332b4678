"""Built-in hardware and model specs, kept as data in `hardware.toml` and `models.toml`.

    load_hardware("dgx-h100")  -> HardwareSpec (one 8-GPU machine, tensor parallel inside it)
    load_model("llama2-70b")   -> ModelSpec
    kv_capacity_tokens(model, hw)  -> tokens of KV cache one machine holds

Units: bytes, seconds, watts unless a field name says otherwise (`hbm_gb` is 1e9 bytes,
`hbm_bw_gbs` is 1e9 bytes/s, `bf16_tflops` is 1e12 FLOP/s, `power_kw` is kilowatts).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources
from typing import Any

from splitserve.errors import UserError

__all__ = [
    "HardwareSpec",
    "ModelSpec",
    "RooflineCalibration",
    "activation_reserve_bytes",
    "hardware_names",
    "kv_capacity_tokens",
    "load_hardware",
    "load_model",
    "model_names",
]


@dataclass(frozen=True, slots=True)
class RooflineCalibration:
    """Efficiency constants of `splitserve.perf.roofline.RooflinePerfModel`, fitted per hardware.

    With L layers, T batched prompt tokens, b decoding requests:
    prompt = cap_slowdown * (L * prompt_layer_overhead_s
                             + max(F / (P * mfu(T)), bytes / (BW * mbu)))
        1 / mfu(T) = 1 / mfu + (1 / mfu_large - 1 / mfu) * T / (T + mfu_knee_tokens)
    decode = L * (token_layer_overhead_s + b * token_seq_layer_overhead_s)
             + max(F / (P * mfu), bytes / (BW * mbu))
    See docs/perf-model.md for the derivation and the fit.
    """

    mfu: float                       # model FLOPs utilisation of a small prompt batch
    mfu_large: float                 # ... of a very large prompt batch (power-limited clocks)
    mfu_knee_tokens: float           # batched prompt tokens half way between the two
    mbu: float                       # memory-bandwidth utilisation (weights + KV reads)
    prompt_layer_overhead_s: float   # fixed cost per layer of one prompt iteration
    token_layer_overhead_s: float    # fixed cost per layer of one decode iteration
    token_seq_layer_overhead_s: float  # extra decode cost per layer per request in the batch
    prompt_cap_slowdown: float       # prompt-phase slowdown from the GPU power cap (1 = uncapped)
    fitted_on: str = ""              # machine whose profile the overheads were fitted to ("" = this
                                     # one): their tensor-parallel all-reduces ran on ITS links


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One machine: `gpus` GPUs joined by NVLink, tensor parallel across them."""

    name: str
    gpu: str
    gpus: int
    hbm_gb: float            # per GPU, 1e9 bytes
    hbm_bw_gbs: float        # per GPU, 1e9 bytes/s
    bf16_tflops: float       # per GPU, dense (no sparsity), 1e12 FLOP/s
    nvlink_gbs: float        # per GPU, total GPU-to-GPU bandwidth, both directions together, 1e9
                             # bytes/s: NVLink, or PCIe on a machine without NVLink
    nvlink_latency_s: float  # per step of a ring collective between two GPUs of the machine, s
    ib_gbs: float            # per machine, inter-machine bandwidth usable by one KV transfer, 1e9 B/s
    cost_per_hour: float     # $ per machine-hour
    power_kw: float          # provisioned power of the machine (GPUs), kW
    gpu_tdp_w: float         # rated GPU power (TDP), W
    power_cap_frac: float    # GPU power cap as a fraction of TDP (1.0 = uncapped)
    machine_power_frac: float  # provisioned machine power as a fraction of gpus * TDP
    profile_name: str | None   # `hardware` column of profile CSVs, None when never profiled
    roofline: RooflineCalibration

    @property
    def hbm_bytes(self) -> float:
        """HBM of the whole machine in bytes."""
        return self.gpus * self.hbm_gb * 1e9

    @property
    def ib_bytes_per_s(self) -> float:
        return self.ib_gbs * 1e9

    @property
    def link_bytes_per_s(self) -> float:
        """GPU-to-GPU bandwidth one way (half of `nvlink_gbs`, which counts both directions): what a
        ring collective's step moves per second, each GPU sending and receiving at once."""
        return self.nvlink_gbs * 1e9 / 2.0

    @property
    def power_cap_w(self) -> float:
        """Most the machine's GPUs may draw together: cap * TDP * gpus."""
        return self.power_cap_frac * self.gpu_tdp_w * self.gpus


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of a decoder-only transformer, dense or mixture of experts (MoE).

    An MoE model (`experts` > 1) replaces every layer's MLP by `experts` SwiGLU MLPs of width
    `intermediate` (three hidden x intermediate matrices each) and a router; each token runs
    `experts_per_token` of them. `params` counts every expert; `active_params` what one token uses.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int        # MLP width; an MoE model's width of ONE expert
    vocab: int
    params: int              # all weights, every expert included
    max_context: int
    dtype_bytes: int
    experts: int = 1                 # MLPs per layer (1 = dense)
    experts_per_token: int = 1       # MLPs each token runs (top-k routing)

    def __post_init__(self) -> None:
        if not 1 <= self.experts_per_token <= self.experts:
            raise ValueError(
                f"model {self.name!r}: need 1 <= experts_per_token ({self.experts_per_token}) "
                f"<= experts ({self.experts})"
            )
        if self.experts > 1 and self.params <= self.expert_params:
            raise ValueError(
                f"model {self.name!r}: params {self.params} must exceed the experts' "
                f"{self.expert_params} (attention, embeddings and router come on top)"
            )

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token: 2 * layers * kv_heads * head_dim * dtype_bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        """Every weight, all experts included (what the GPUs must hold)."""
        return self.params * self.dtype_bytes

    @property
    def params_per_expert(self) -> int:
        """One expert's SwiGLU MLP summed over the layers: layers * 3 * hidden * intermediate.
        0 for a dense model (its MLP counts as shared, not as an expert)."""
        return 3 * self.layers * self.hidden * self.intermediate if self.is_moe else 0

    @property
    def expert_params(self) -> int:
        """All experts of all layers: experts * params_per_expert (0 for a dense model)."""
        return self.experts * self.params_per_expert

    @property
    def shared_params(self) -> int:
        """Weights every token uses: embeddings, attention, norms, router (all of a dense model)."""
        return self.params - self.expert_params

    @property
    def active_params(self) -> int:
        """Weights one token computes with: shared + experts_per_token experts (params if dense)."""
        return self.shared_params + self.experts_per_token * self.params_per_expert


# ----------------------------------------------------------------------------- loading


def _read_toml(filename: str) -> dict[str, Any]:
    with resources.files(__name__).joinpath(filename).open("rb") as f:
        return tomllib.load(f)


def _build(
    cls: type, name: str, table: dict[str, Any], defaults: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Constructor arguments of `cls` from a TOML table, refusing missing or unknown keys;
    a key of `defaults` may be left out and then takes its value from there."""
    defaults = defaults or {}
    wanted = {f.name for f in fields(cls)} - {"name", "roofline"}
    given = set(table)
    missing = wanted - given - set(defaults)
    unknown = given - wanted - {"roofline"}
    if missing or unknown:
        raise ValueError(
            f"catalog entry {name!r}: missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    return {k: table[k] if k in table else defaults[k] for k in wanted}


@lru_cache(maxsize=1)
def _hardware_table() -> dict[str, HardwareSpec]:
    raw = _read_toml("hardware.toml")
    out: dict[str, HardwareSpec] = {}
    for name, table in raw.items():
        kwargs = _build(HardwareSpec, name, table, defaults={"profile_name": None})
        if "roofline" not in table:
            raise ValueError(f"catalog entry {name!r}: missing [roofline] table")
        rf = table["roofline"]
        rf_names = {f.name for f in fields(RooflineCalibration)}
        if not rf_names - {"fitted_on"} <= set(rf) <= rf_names:
            raise ValueError(f"catalog entry {name!r}: roofline keys must be {sorted(rf_names)} "
                             f"(fitted_on optional)")
        spec = HardwareSpec(name=name, roofline=RooflineCalibration(**rf), **kwargs)
        rule_kw = spec.gpus * spec.gpu_tdp_w * spec.machine_power_frac / 1000.0
        if abs(spec.power_kw - rule_kw) > 1e-9:
            raise ValueError(
                f"catalog entry {name!r}: power_kw {spec.power_kw} != gpus * gpu_tdp_w * "
                f"machine_power_frac / 1000 = {rule_kw}"
            )
        out[name] = spec
    for name, spec in out.items():
        ref = spec.roofline.fitted_on
        if ref and (ref not in out or out[ref].roofline.fitted_on or out[ref].gpus != spec.gpus):
            raise ValueError(
                f"catalog entry {name!r}: roofline fitted_on {ref!r} must name a machine with "
                f"its own fit and the same GPU count"
            )
    return out


@lru_cache(maxsize=1)
def _model_table() -> dict[str, ModelSpec]:
    raw = _read_toml("models.toml")
    dense = {"experts": 1, "experts_per_token": 1}   # MoE keys: optional, dense by default
    return {
        name: ModelSpec(name=name, **_build(ModelSpec, name, t, defaults=dense))
        for name, t in raw.items()
    }


def hardware_names() -> list[str]:
    return sorted(_hardware_table())


def model_names() -> list[str]:
    return sorted(_model_table())


def load_hardware(name: str) -> HardwareSpec:
    table = _hardware_table()
    if name not in table:
        raise UserError(f"unknown hardware {name!r}; valid names: {', '.join(sorted(table))}")
    return table[name]


def load_model(name: str) -> ModelSpec:
    table = _model_table()
    if name not in table:
        raise UserError(f"unknown model {name!r}; valid names: {', '.join(sorted(table))}")
    return table[name]


# ----------------------------------------------------------------------------- memory


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
