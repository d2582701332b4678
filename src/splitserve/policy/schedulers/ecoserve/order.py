"""EcoServe's per-request state and the order of its queues (schedulers/ecoserve/: 2, 3, 4)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...state import Machine, Request

GROUP = 32              # predicted lengths in one GROUP-token step form a time-synced group (§2.1's block)
RESERVE = 0.03          # share of KV that reservations for predicted outputs leave free (§2.2, §4: 2-4%)
BUFFER = 0.15           # b, as a share of the host's predicted length (§4: 10-15%)
SLO_SCALE = 2.0         # a deadline: arrival + SLO_SCALE x (T_PROMPT + T_TOKEN x predicted) (§4)
T_PROMPT = 0.1          # s, a prompt's mean latency (ASSUMED: measured per dataset, not given)
T_TOKEN = 0.05          # s, a token's mean latency (ASSUMED)
DEADLINE_BUCKET = 0.5   # s (ASSUMED: the paper's example ranges 0.2-0.5 s, 0.5-2 s)
KV_BUCKET = 128         # tokens (ASSUMED)

PromptKey = tuple[int, int, float, int]   # deadline bucket, -prefill tokens, arrival, id


@dataclass(slots=True, eq=False)
class Gen:
    """What EcoServe keeps of a request (its `Request.sched`, made when first needed)."""

    host: Request | None = None   # the request whose reserved KV it decodes into (itself: it reserved
                                  # its own; None: not decoding in a reservation, or it lost its KV)
    deadline: float = -1.0        # when its SLO ends, seconds (-1: not yet set)
    pkey: PromptKey = (0, 0, 0.0, 0)   # its prompt_key, for a prefill of pkey_len tokens
    pkey_len: int = -1                 # -1: not yet keyed


def gen(r: Request) -> Gen:
    s: Gen | None = r.sched
    if s is None:
        s = r.sched = Gen()
    return s


def host(r: Request) -> Request | None:
    """The request whose reservation `r` decodes into (itself: its own), or None."""
    s = r.sched
    return None if s is None else s.host


def set_host(r: Request, h: Request | None) -> None:
    if h is not None or r.sched is not None:
        gen(r).host = h


def predicted(r: Request) -> int:
    """The output tokens `r` is predicted to make in all (its limit when it has no prediction)."""
    return r.predicted or r.output_tokens


def left(r: Request) -> int:
    return predicted(r) - r.generated


def deadline(r: Request) -> float:
    """When `r`'s JCT SLO ends (fixed at its first prediction)."""
    s = gen(r)
    if s.deadline < 0:
        s.deadline = r.arrival + SLO_SCALE * (T_PROMPT + T_TOKEN * predicted(r))
    return s.deadline


def prompt_key(r: Request) -> PromptKey:
    """The prompt queue's order: deadline bucket, longer prefill first, then arrival. Kept in its
    Gen (the deadline is fixed once set; the prefill grows only when a preempted request is
    requeued), so sorting a long queue again costs no key per request."""
    s = gen(r)
    n = r.prefill_len
    if s.pkey_len != n:
        s.pkey, s.pkey_len = (int(deadline(r) // DEADLINE_BUCKET), -n, r.arrival, r.id), n
    return s.pkey


def gt_key(r: Request) -> tuple[int, int, int, float, int]:
    return (int(deadline(r) // DEADLINE_BUCKET), -(r.kv_held // KV_BUCKET), -left(r) // GROUP, r.arrival, r.id)


def reserve(m: Machine) -> int:
    return m.kv_round(math.ceil(RESERVE * m.kv_capacity))


def repredict(r: Request) -> None:
    """`r` reached its predicted length and goes on: predicted to make as many again (ASSUMED)."""
    if left(r) <= 0:
        r.predicted = r.generated + predicted(r)


def written(m: Machine, r: Request) -> int:
    """KV tokens (whole blocks) `r` will have written after its next decode step."""
    return m.kv_round(r.prompt_tokens + r.generated)
