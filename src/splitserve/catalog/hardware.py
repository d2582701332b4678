"""The hardware entries of the catalog (hardware.toml): one machine of `gpus` GPUs, and the
roofline efficiency constants fitted to it.

Units: bytes, seconds, watts unless a field name says otherwise (`hbm_gb` is 1e9 bytes,
`hbm_bw_gbs` is 1e9 bytes/s, `bf16_tflops` is 1e12 FLOP/s, `power_kw` is kilowatts).
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    fitted_ref: HardwareSpec | None = field(default=None, compare=False, repr=False)
                                     # that machine, as the catalog holding both has it (set by
                                     # the catalog; None: look `fitted_on` up in the built-in one)


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
