"""Batched latency of one worker (Aladdin, Nie et al., 2024, §3.2), as a cluster scheduler that places
by it sees it (policy/aladdin.py): the simulator binds its machines' perf models (`PerfLatency`,
ClusterScheduler.bind_latency), the live router keeps `LIVE_FIT`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .state import Machine

GAMMA = 0.5            # §4.2: "we normally set gamma = 0.5" (context at the middle of a request's life)
TTFT_CONTEXT = 4096    # §6.1: the prefill SLO is the latency of the model's context length, 4096
ATGT_FACTOR = 1.3      # §6.1: batched decoding at most 1.3 times a lone request's


class BatchLatency(Protocol):
    """Batched latency of one worker (§3.2), in seconds."""

    def prefill_time(self, m: Machine, tokens: int) -> float:
        """A prefill batch of `tokens` prompt tokens in total on `m` (Eq. 2)."""

    def decode_time(self, m: Machine, batch: int, context: int) -> float:
        """A decode iteration of `batch` requests holding `context` KV tokens in total (Eq. 3)."""


@dataclass(frozen=True, slots=True)
class LinearLatency:
    """Eq. 2 and Eq. 3: t_pre = k1 * tokens + c1; t_d = (k2 * l_ave + c2) * b + c3 =
    k2 * context + c2 * b + c3."""

    k1: float
    c1: float
    k2: float
    c2: float
    c3: float

    def prefill_time(self, m: Machine, tokens: int) -> float:
        return self.k1 * tokens + self.c1

    def decode_time(self, m: Machine, batch: int, context: int) -> float:
        return self.k2 * context + self.c2 * batch + self.c3


# The live router's fit: least squares of Eq. 2 and Eq. 3 to the tiny model's engine steps on the
# dev VM (CPU, float32, one thread; `python scripts/aladdin_live_fit.py`): prefills of 16..480
# tokens, decodes of 1..32 requests at 16..480 prompt tokens each. The VM's two cores are shared,
# so its steps are noisy: the fit's largest relative errors were 70% (prefill) and 30% (decode).
LIVE_FIT = LinearLatency(k1=6.81e-06, c1=0.000452, k2=3.29e-08, c2=7.61e-06, c3=0.000428)


class PhaseTimes(Protocol):
    """What PerfLatency reads of a machine's perf model (perf/ PerfModel)."""

    def prompt_time(self, tokens: int) -> float: ...

    def token_time(self, batch: int, context: int) -> float: ...


class PerfLatency:
    """The simulator's latency model: each machine's perf model (perf/), the one that times its
    batches."""

    __slots__ = ("perfs",)

    def __init__(self, perfs: Sequence[PhaseTimes]) -> None:
        self.perfs = perfs

    def prefill_time(self, m: Machine, tokens: int) -> float:
        return self.perfs[m.id].prompt_time(tokens)

    def decode_time(self, m: Machine, batch: int, context: int) -> float:
        return self.perfs[m.id].token_time(batch, context)
