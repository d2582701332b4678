"""The kinds of event on the simulator's heap (sim/simulator.py): (time, seq, kind, object)."""

from __future__ import annotations

from typing import Protocol

ARRIVAL, ITER_END, TRANSFER_END, STAGE_FREE, WATCH, TURN, SHARED_END = 0, 1, 2, 3, 4, 5, 6
# TURN: a conversation's next turn arrives (sim/prefix.py), outside the workload's arrival order
# SHARED_END: (machine, version) a step on shared cores ends, unless re-timed since (sim/sharing.py)


class Arrival(Protocol):
    """What an ARRIVAL or a TURN event carries: a request as its workload gives it (workload/
    RequestSpec, a conversation's Turn)."""

    @property
    def arrival(self) -> float: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def output_tokens(self) -> int: ...
