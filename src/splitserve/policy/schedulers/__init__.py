"""Machine-level schedulers by name: which work one machine runs in its next iteration.

Each is a small module that makes a `MachineScheduler` (base.py: its `form_batch` and what it
declares: chunked, default chunk, predicted lengths, its own state and report) from the shared
rules of policy/machine.py (prompt_take, admit_prompt, make_room, preemption_victims, close_batch);
none changes a counter itself: the transitions of policy/transitions.py do. `SCHEDULERS` is the
one registry; `BatchingConfig.scheduler` (`--machine-scheduler`) picks one, and `finish_iteration`
is the same for all. The simulator and the live engine (engine/scheduler.py) both run every one.

    splitwise           mixed continuous batching, prompts first, whole prompts to a token cap (default)
    vllm                vLLM v0: an iteration of prefills only, or of decodes only
    orca                Orca: prompts and decodes together, admission reserves max_len per request
    sarathi             Sarathi-Serve: stall-free chunked prefill under a token budget
    fastertransformer   static batches: nobody joins until the whole batch has finished
    lightllm            LightLLM: prefill-first, KV on demand, admission by the estimated peak KV
    tetriinfer-fcfs|sjf|ljf  TetriInfer: 512-token chunks, prompts FCFS / shortest / longest first
    ecoserve            EcoServe: prompt and generation queues, KV for the predicted output, same-length
                        groups, deadline/KV/length order, a long reservation lent to short requests

Adding one: a module here that makes its `MachineScheduler`, and its line in `SCHEDULERS`.
"""

from __future__ import annotations

from ..kv_allocation import ON_DEMAND
from ..machine import Batch, BatchingConfig
from ..state import Machine
from . import ecoserve, fastertransformer, lightllm, orca, sarathi, splitwise, tetriinfer, vllm
from .base import FormBatch, MachineScheduler

SCHEDULERS: dict[str, MachineScheduler] = {s.name: s for s in (
    splitwise.SCHEDULER,
    vllm.SCHEDULER,
    orca.SCHEDULER,
    sarathi.SCHEDULER,
    fastertransformer.SCHEDULER,
    lightllm.SCHEDULER,
    tetriinfer.FCFS,
    tetriinfer.SJF,
    tetriinfer.LJF,
    ecoserve.SCHEDULER,
)}


def scheduler_of(cfg: BatchingConfig) -> MachineScheduler:
    """The machine-level scheduler `cfg.scheduler` names."""
    return SCHEDULERS[cfg.scheduler]


def batch_former(cfg: BatchingConfig) -> FormBatch:
    """The form_batch of `cfg.scheduler`, for a caller that forms many batches (the simulator)."""
    return SCHEDULERS[cfg.scheduler].form_batch


def vllm_allocation(scheduler: str | None) -> str:
    """How a system built on vLLM allocates KV running machine scheduler `scheduler` (None: the
    default): on demand, unless the scheduler allocates by its own rule (policy/kv_allocation.py)."""
    return SCHEDULERS[scheduler or BatchingConfig().scheduler].allocation or ON_DEMAND


def form_batch(m: Machine, cfg: BatchingConfig) -> Batch | None:
    """The next iteration's work on `m`, or None when it has nothing to run, by the machine-level
    scheduler `cfg.scheduler` (the default, "splitwise", is policy/machine.py form_mixed)."""
    return SCHEDULERS[cfg.scheduler].form_batch(m, cfg)


__all__ = ["SCHEDULERS", "MachineScheduler", "batch_former", "form_batch", "scheduler_of", "vllm_allocation"]
