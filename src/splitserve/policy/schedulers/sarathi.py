"""Sarathi-Serve (Agrawal et al., OSDI'24): stall-free chunked prefill. Every iteration holds at
most `chunk_size` tokens (512 when `chunk_size` is 0 under this scheduler): every running decode
first (one token each, so decodes never stall behind a prompt), then prompt chunks FCFS in what
is left of the budget; a prefill in progress stays at the queue's head until done. KV on demand
(Sarathi-Serve runs on vLLM; `--policy sarathi`'s default): a prompt's first chunk takes its
blocks when they and the watermark are free, and a decode that cannot take its next block preempts
the last joined (recomputed later); under `--kv-allocation reserve` the first chunk reserves the
whole prompt + output and may preempt the youngest decodes instead.

This is the splitwise scheduler's chunk path (policy/machine.py: prompt_budget, prompt_take) under
another default. Where it differs from Sarathi-Serve: its budget is tuned per deployment from the
TBT SLO; here it is a setting.
"""

from __future__ import annotations

import dataclasses
import functools

from ..machine import Batch, BatchingConfig, form_mixed
from ..state import Machine
from .base import MachineScheduler

DEFAULT_CHUNK = 512   # Sarathi-Serve's token budget in its evaluation of Mistral-7B / Yi-34B


@functools.lru_cache(maxsize=16)
def chunked(cfg: BatchingConfig) -> BatchingConfig:
    """`cfg` with a token budget: its own chunk_size, or DEFAULT_CHUNK when that is 0."""
    return cfg if cfg.chunk_size > 0 else dataclasses.replace(cfg, chunk_size=DEFAULT_CHUNK)


def form_batch(m: Machine, cfg: BatchingConfig) -> Batch | None:
    return form_mixed(m, chunked(cfg))


SCHEDULER = MachineScheduler("sarathi", form_batch, "Sarathi-Serve: stall-free chunked prefill under a token budget",
                             chunked=True, default_chunk=DEFAULT_CHUNK)
