"""TetriInfer's prefill scheduler (Hu et al., 2024; §3.3.1 and §3.3.3): waiting
prompts ordered first-come-first-serve, shortest-job-first or longest-job-first by prompt length,
then sliced and merged into fixed-size chunks of ChunkSize tokens (512 in its evaluation, §5.2)
"without altering their order".

Here: the chunk path of the splitwise scheduler (policy/machine.py; Sarathi's budget, so on a
machine that also decodes, its running decodes go first), with the waiting queue ordered by the
policy before each iteration. Non-preemptive, as TetriInfer's policies are: a prompt whose prefill
has started (it holds its KV and sits at the queue's head) finishes before any other starts. Where
it differs: TetriInfer pads the last chunk of an iteration to ChunkSize with zeros; the simulator
charges the tokens computed, not the padding.
"""

from __future__ import annotations

import dataclasses
import functools

from ..machine import Batch, BatchingConfig, form_mixed
from ..state import Machine
from .base import MachineScheduler

CHUNK = 512   # TetriInfer's ChunkSize in its evaluation (OPT-13B, §5.2)


@functools.lru_cache(maxsize=16)
def chunked(cfg: BatchingConfig) -> BatchingConfig:
    return cfg if cfg.chunk_size > 0 else dataclasses.replace(cfg, chunk_size=CHUNK)


def order(m: Machine, longest_first: bool) -> None:
    """Sort `m`'s waiting prompts by length (stable: FCFS among equals), a started prefill first."""
    q = m.prompt_queue
    if len(q) < 2:
        return
    started = [r for r in q if r.prefilled > 0]
    rest = sorted((r for r in q if r.prefilled == 0), key=lambda r: r.prefill_len, reverse=longest_first)
    q.clear()
    q.extend(started + rest)


def fcfs(m: Machine, cfg: BatchingConfig) -> Batch | None:
    return form_mixed(m, chunked(cfg))


def sjf(m: Machine, cfg: BatchingConfig) -> Batch | None:
    order(m, longest_first=False)
    return form_mixed(m, chunked(cfg))


def ljf(m: Machine, cfg: BatchingConfig) -> Batch | None:
    order(m, longest_first=True)
    return form_mixed(m, chunked(cfg))


FCFS = MachineScheduler("tetriinfer-fcfs", fcfs, "TetriInfer: 512-token chunks, prompts first come first served",
                        chunked=True, default_chunk=CHUNK)
SJF = MachineScheduler("tetriinfer-sjf", sjf, "TetriInfer: 512-token chunks, shortest prompt first",
                       chunked=True, default_chunk=CHUNK)
LJF = MachineScheduler("tetriinfer-ljf", ljf, "TetriInfer: 512-token chunks, longest prompt first",
                       chunked=True, default_chunk=CHUNK)
