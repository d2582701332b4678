"""Pipeline parallelism: a model instance of `pp` stages, each `tp` GPUs running L / pp layers.

A stage runs a batch in the whole model's time on `tp` GPUs divided by pp (exact for the roofline,
whose every term scales with the layers; first-order for a profile). Between stages the batch's
activations hop to the next stage's GPUs, each of the tp GPUs sending its 1/tp share over its own
link (NVLink inside a machine, the network where stage s + 1 starts a new machine):

    hop(s, tokens) = HOP_LATENCY_S + tokens * hidden * dtype_bytes / (tp * bw(s))

The simulator runs batches through the stages (sim/stages.py), so up to `pp` are in flight;
`mixed_time` and friends answer for one batch alone: pp stages and pp - 1 hops.
docs/perf-model.md ("Pipeline parallelism") has the details.
"""

from __future__ import annotations

from splitserve.catalog import HardwareSpec, ModelSpec
from .model import PerfModel

# ESTIMATE: the order of a NCCL point-to-point send of a small message between GPUs; it matters
# only for decode batches of a few tokens.
HOP_LATENCY_S = 10e-6


class PipelinePerf:
    """The perf model of a `pp`-stage instance over `base`, the perf model of its tp GPUs running
    every layer."""

    __slots__ = ("base", "pp", "source", "attention", "additive", "_hops", "_inv_pp")

    def __init__(self, base: PerfModel, model: ModelSpec, hw: HardwareSpec, tp: int, pp: int) -> None:
        self.base, self.pp = base, pp
        self.source = f"{base.source}, {pp} pipeline stages"
        self.attention = base.attention           # the simulator passes prompt_sq when set
        self.additive = base.additive
        per_machine = max(hw.gpus // tp, 1)
        act = float(model.hidden * model.dtype_bytes)
        self._hops = tuple(act / (tp * (hw.ib_gbs if (s + 1) % per_machine == 0 else hw.nvlink_gbs) * 1e9)
                           for s in range(pp - 1))    # seconds per token of the hop after stage s
        self._inv_pp = 1.0 / pp

    def stage_time(self, prompt_tokens: int, batch: int, context: int, prompt_sq: int = 0) -> float:
        """One stage's share of a batch (its layers)."""
        return self.base.mixed_time(prompt_tokens, batch, context, prompt_sq) * self._inv_pp

    def hop_time(self, stage: int, tokens: int) -> float:
        """The batch's activations from stage `stage` to the next."""
        return HOP_LATENCY_S + tokens * self._hops[stage]

    def _alone(self, stage: float, tokens: int) -> float:
        return self.pp * stage + sum(self.hop_time(s, tokens) for s in range(self.pp - 1))

    def mixed_time(self, prompt_tokens: int, batch: int, context: int, prompt_sq: int = 0) -> float:
        return self._alone(self.stage_time(prompt_tokens, batch, context, prompt_sq), prompt_tokens + batch)

    def prompt_time(self, tokens: int) -> float:
        return self._alone(self.base.prompt_time(tokens) * self._inv_pp, tokens)

    def token_time(self, batch: int, context: int) -> float:
        return self._alone(self.base.token_time(batch, context) * self._inv_pp, batch)

    def __repr__(self) -> str:
        return f"PipelinePerf({self.base!r}, pp={self.pp})"
