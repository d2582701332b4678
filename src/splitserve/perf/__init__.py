"""Performance models: how long a batch takes on one machine, and what power it draws.

Every model answers in seconds for one machine (all its GPUs, tensor parallel):
  prompt_time(tokens)                       a prompt-only batch of `tokens` prompt tokens in total
  token_time(batch, context)                one decode iteration of `batch` requests whose KV caches
                                            hold `context` tokens in total
  mixed_time(prompt_tokens, batch, context) one iteration that runs prompts and decodes together
These sit on the simulator's hot path: keep them O(1) and allocation-free.

Implementations: perf.profile.ProfilePerfModel (measured table), perf.operator_perf.OperatorPerfModel
(operators fitted on measured GPU profiles), perf.roofline.RooflinePerfModel (analytical);
perf.power.ProfilePowerModel / AnalyticalPowerModel (watts per machine).
`make_perf_model` picks them. docs/perf-model.md has the forms and their errors. The simulator
asks them through perf/step.py's `StepModel`, one per machine (`PerfStep` wraps these).
"""

from __future__ import annotations

import os

from splitserve.catalog import HardwareSpec, ModelSpec
from splitserve.errors import UserError
from splitserve.perf.decode_lookup import with_decode_lookup
from splitserve.perf.model import PerfModel, PowerModel
from splitserve.perf.operator_perf import OperatorPerfModel, operator_gpu
from splitserve.perf.pipeline import PipelinePerf
from splitserve.perf.power import AnalyticalPowerModel, ProfilePowerModel
from splitserve.perf.profile import ProfilePerfModel, read_profile_rows
from splitserve.perf.roofline import RooflinePerfModel

__all__ = ["PerfModel", "PowerModel", "make_perf_model", "check_perf_model", "ROOFLINE_FIT"]

PERF_MODELS = ("auto", "operators", "roofline")

ROOFLINE_FIT = frozenset({("llama2-70b", 8), ("bloom-176b", 8)})
"""(model, tp) of the Splitwise profile rows hardware.toml's [fit] roofline constants were fitted on:
there the roofline stands in for that profile (the package never reads it); docs/perf-model.md."""


def make_perf_model(
    model: ModelSpec,
    hw: HardwareSpec,
    tp: int | None = None,
    profile: str | os.PathLike[str] | None = None,
    pp: int = 1,
    ep: int = 1,
    kind: str = "auto",
    decode_lookup: str = "batch-size",
) -> tuple[PerfModel, PowerModel]:
    """The perf and power models for `model` on one `hw` machine at tensor parallel `tp`.

    With `profile` (a CSV path in the Splitwise profile format) holding rows for
    (model.name, hw.profile_name, tp): a ProfilePerfModel, and a ProfilePowerModel when those rows
    carry power measurements (AnalyticalPowerModel otherwise). Else an OperatorPerfModel where the
    operator fit covers the GPU (A100, H100), ep is 1 and the roofline was not fitted on this
    (model, tp) on this machine's profile (ROOFLINE_FIT), and a RooflinePerfModel otherwise; with an
    AnalyticalPowerModel. The perf model's `source` says which: "profile:<path>", "operators" or
    "roofline". `kind` "operators" or "roofline" asks for that model where no profile row applies
    (a UserError where the operator fit cannot answer).
    tp defaults to the machine's GPU count. With `pp` > 1 the perf model is a PipelinePerf over it
    (perf/pipeline.py): `pp` stages of `tp` GPUs; `ep`: expert parallel (perf/roofline.py). The power
    model counts the instance's GPUs only (one stage's; the simulator counts every stage). A `profile` path that cannot be read is a UserError.
    `decode_lookup`: how a decode batch's time is read (perf/decode_lookup.py; "batch-tokens":
    SplitwiseSim's lookup, from the profile's rows).
    """
    if tp is None:
        tp = hw.gpus
    check_perf_model(kind)
    perf, power = _one_stage_group(model, hw, tp, profile, ep, kind)
    perf = with_decode_lookup(perf, decode_lookup, profile, model.name, hw.profile_name, tp)
    if pp > 1:
        perf = PipelinePerf(perf, model, hw, tp, pp)
    return perf, power


def check_perf_model(kind: str) -> None:
    if kind not in PERF_MODELS:
        raise UserError(f"--perf-model must be auto, operators or roofline, got {kind!r}")


def _one_stage_group(model: ModelSpec, hw: HardwareSpec, tp: int, profile: str | os.PathLike[str] | None, ep: int,
                     kind: str) -> tuple[PerfModel, PowerModel]:
    if profile is not None and not os.path.isfile(profile):
        raise UserError(f"profile {os.fspath(profile)!r} is not a readable file")
    if profile is not None and hw.profile_name is not None:
        rows = read_profile_rows(profile, model.name, hw.profile_name, tp)
        if rows:
            perf = ProfilePerfModel.from_rows(rows, source=f"profile:{os.fspath(profile)}")
            measured = ProfilePowerModel.from_rows(rows, hw, tp, others_idle=False)
            return perf, (measured if measured.has_data else AnalyticalPowerModel(hw, tp, others_idle=False))
    power = AnalyticalPowerModel(hw, tp, others_idle=False)
    if kind == "operators":
        if ep != 1:
            raise UserError("the operator model has no expert parallelism; use --perf-model roofline with --ep")
        return OperatorPerfModel(model, hw, tp), power
    fitted = hw.profile_name is not None and (model.name, tp) in ROOFLINE_FIT
    if (kind == "auto" and ep == 1 and not fitted and operator_gpu(hw) is not None and model.heads % tp == 0
            and 1 <= tp <= hw.gpus):
        return OperatorPerfModel(model, hw, tp), power
    return RooflinePerfModel(model, hw, tp, ep=ep), power
