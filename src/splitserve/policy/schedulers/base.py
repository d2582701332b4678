"""What a machine-level scheduler is: its `form_batch` and what it declares about itself.

A `MachineScheduler` is a plain record. The simulator, the live engine and the router's view ask
it, never its name:
- `form_batch(m, cfg)`: the next iteration's work on machine `m` (policy/machine.py states the
  shared rules every scheduler is built from); called once per iteration, as a plain function;
- `chunked`: whether it prefills in chunks (`--chunk-size` applies), and `default_chunk`: its
  token budget when the chunk size is 0 (0: whole prompts);
- `predicts`: whether it schedules by a request's predicted output length, which a request then
  carries from its arrival (policy/predictor.py arrival_predictor);
- its own state: what it keeps per request and per machine beyond the shared `Request` and
  `Machine` (`Request.sched`, `Machine.sched`: objects of its own types; None under the others),
  and its own report of a step, made by the machine that ran the step (`report`) and applied by a
  view of that machine kept elsewhere (`apply_report`, the router's view; serve/cluster_state.py),
  opaque to everyone else (BatchReport.sched, the `step` message's `sched`). The defaults here keep
  nothing and report nothing; EcoServe's (schedulers/ecoserve/) keep and report its KV sizing.

Adding a scheduler is one module of policy/schedulers/ that makes a `MachineScheduler` and one
line in the registry of policy/schedulers/__init__.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..machine import Batch, BatchingConfig
from ..state import Machine, Request

FormBatch = Callable[[Machine, BatchingConfig], "Batch | None"]


@dataclass(frozen=True, slots=True)
class MachineScheduler:
    name: str                   # --machine-scheduler
    form_batch: FormBatch
    about: str = ""             # one line for --help lists
    chunked: bool = False       # prefills in chunks: --chunk-size applies
    default_chunk: int = 0      # its chunk budget when --chunk-size is 0 (0: whole prompts)
    predicts: bool = False      # schedules by predicted output lengths, predicted at arrival
    pools_kv: bool = False      # requests decode into KV reserved by another (`kv_pool`): the live
                                # engine keeps a block pool per reservation (engine/block_manager.py)
    allocation: str = ""        # the KV allocation it takes by its own rule (policy/kv_allocation.py):
                                # RESERVE (orca's max-length slots), ON_DEMAND (lightllm's token-by-
                                # token KV), "": either, as --kv-allocation says

    def record(self, m: Machine) -> None:
        """`m` is a view kept for another (the engine's view of itself, whose steps the router's view
        follows): from now on its form_batch records what `report` tells."""

    def report(self, m: Machine, rid: Callable[[Request], str]) -> Any:
        """What form_batch did on `m` since the last report beyond the batch's chunks, preemptions
        and joins (what `record` made it record), each request by its id `rid(r)`, in plain lists (a
        message field: BatchReport.sched, the `step` message's `sched`), and forget it; None:
        nothing to tell."""
        return None

    def check_report(self, rep: Any) -> str | None:
        """Why `rep`, a step's report as it came off the wire, is not one `report` makes (None: it
        is); the router drops a step whose report is malformed, as it drops any malformed message.
        The default reports nothing, so anything but None is malformed."""
        return None if rep is None else "this machine scheduler reports nothing"

    def apply_report(self, m: Machine, rep: Any, get: Callable[[str], Request | None]) -> "Applying":
        """A view of machine `m` kept elsewhere (the router's) applies a step's report `rep` (from
        `report`, None when it told nothing; `get`: request id -> the view's request, None when it
        has none), step by step (`Applying`)."""
        return NOTHING

    def kv_pool(self, r: Request) -> Request | None:
        """The request whose reserved KV `r` decodes into (itself: its own), None: no pool."""
        return None


class Applying:
    """A scheduler's report of a step being applied to a view in the order its form_batch acted:
    `before` the batch's preemptions, `preempted(r)` for each decode preempted, `after` them, then
    `planned(r)` for each prompt chunk that starts (True: its KV was sized, policy/transitions.py
    plan_kv). The defaults do nothing."""

    __slots__ = ()

    def before(self) -> None:
        pass

    def preempted(self, r: Request) -> None:
        pass

    def after(self) -> None:
        pass

    def planned(self, r: Request) -> bool:
        return False


NOTHING = Applying()
