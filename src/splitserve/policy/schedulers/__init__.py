"""Machine-level schedulers by name: which work one machine runs in its next iteration.

Each is a small module with a `form_batch(m, cfg)` built from the shared rules of
policy/machine.py (prompt_take, _admit, _make_room, preemption_victims, close_batch); none
changes a counter itself: the transitions of policy/transitions.py do. `BatchingConfig.scheduler`
(`--machine-scheduler`) picks one; policy/machine.py's `form_batch` dispatches on it, and
`finish_iteration` is the same for all. The simulator and the live engine (engine/scheduler.py)
both run every one of them.

    splitwise           mixed continuous batching, prompts first, whole prompts to a token cap (default)
    vllm                vLLM v0: an iteration of prefills only, or of decodes only
    orca                Orca: prompts and decodes together, admission reserves max_len per request
    sarathi             Sarathi-Serve: stall-free chunked prefill under a token budget
    fastertransformer   static batches: nobody joins until the whole batch has finished
    lightllm            LightLLM: prefill-first, admission by the estimated peak KV
    tetriinfer-fcfs|sjf|ljf  TetriInfer: 512-token chunks, prompts FCFS / shortest / longest first
    ecoserve            EcoServe: prompt and generation queues, KV for the predicted output, same-length
                        groups, deadline/KV/length order, a long reservation lent to short requests
"""

from __future__ import annotations

from typing import Callable

from ..machine import Batch, BatchingConfig
from ..state import Machine
from . import ecoserve, fastertransformer, lightllm, orca, sarathi, splitwise, tetriinfer, vllm

SCHEDULERS: dict[str, Callable[[Machine, BatchingConfig], Batch | None]] = {
    "splitwise": splitwise.form_batch,
    "vllm": vllm.form_batch,
    "orca": orca.form_batch,
    "sarathi": sarathi.form_batch,
    "fastertransformer": fastertransformer.form_batch,
    "lightllm": lightllm.form_batch,
    "tetriinfer-fcfs": tetriinfer.fcfs,
    "tetriinfer-sjf": tetriinfer.sjf,
    "tetriinfer-ljf": tetriinfer.ljf,
    "ecoserve": ecoserve.form_batch,
}

# schedulers that prefill in chunks (--chunk-size); the others run whole prompts
CHUNKED = ("splitwise", "sarathi", "tetriinfer-fcfs", "tetriinfer-sjf", "tetriinfer-ljf")
# chunking schedulers whose chunk size 0 means this budget (splitwise's 0: whole prompts)
DEFAULT_CHUNK = {"sarathi": sarathi.DEFAULT_CHUNK, "tetriinfer-fcfs": tetriinfer.CHUNK,
                 "tetriinfer-sjf": tetriinfer.CHUNK, "tetriinfer-ljf": tetriinfer.CHUNK}
