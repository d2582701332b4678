"""A decode preempted on its token worker and sent back through the prompt pool (`--recompute
prompt-pool`) goes on under a new wire id. Its first placement's prompt worker may report that
placement's first token late (the token worker's `kv_in` overtook it, and the request decoded and
was preempted meanwhile); that report must not be read as the next placement's first token: it
once put the request's first token into the middle of its output (tests/serve/test_systems_live.py,
tetriinfer, 1 in about 60 rounds)."""

from __future__ import annotations

from types import SimpleNamespace

from splitserve.policy.state import Request
from splitserve.serve.messages import Stage, WireParams
from splitserve.serve.recovery import Recovery
from splitserve.serve.reports import ReportReader
from splitserve.serve.requests import RequestTable
from splitserve.serve.router_state import RouterState
from splitserve.serve.supervisor import WorkerInfo

PARAMS = WireParams(max_tokens=24, temperature=0.0, top_p=1.0, top_k=0, ignore_eos=True, stop_token_ids=[])


class Flow:
    """RequestFlow's calls, recorded: the tokens each wire id handed to its client."""

    def __init__(self) -> None:
        self.handed: list[tuple[str, list[int]]] = []

    def deliver(self, req, toks, lp=None) -> bool:
        self.handed.append((req.wire, list(toks)))
        req.produced += len(toks)
        return True

    def dispatch(self, req) -> None:
        req.stage = Stage.PREFILL   # routed again: its prompt worker prefills prompt + outputs

    def dispatch_all(self, admitted) -> None:
        pass


def router():
    cluster = SimpleNamespace(arrive=lambda r, again=False: True, end_step=lambda wid, done: [],
                              awaiting_first=lambda r: False)
    state = RouterState(cfg=None, metrics=SimpleNamespace(step_out=lambda *a: None), chan=None, boot=None,
                        workers=[], cluster=cluster)
    flow = Flow()
    recovery = Recovery(state, flow, watch=None)
    return state, flow, recovery, ReportReader(state, flow=flow, recovery=recovery)


def test_a_resumed_request_has_a_new_wire_id_and_keeps_its_tokens():
    table = RequestTable()
    q = table.new("cmpl-1", [5], PARAMS, 0.0)
    r = table.new_try(q, 0.0)
    table.track(q)
    first = q.wire
    q.produced, q.delivered = 16, list(range(16))
    table.rewire(q)
    assert q.wire != first and first not in table.by_wire and table.by_wire[q.wire] is q
    assert q.pr is r and table.by_policy[r.id] is q and q.produced == 16   # the same try, its tokens kept
    second = q.wire
    table.rewire(q)
    assert len({first, second, q.wire}) == 3


def test_the_first_placements_late_first_token_is_not_the_resumed_ones():
    state, flow, recovery, reports = router()
    prompt = WorkerInfo(0, "prompt")
    q = state.reqs.new("cmpl-1", [171], PARAMS, 0.0)
    q.pr = Request(0, 0.0, 1, 24)
    q.wire, q.tries, q.stage, q.produced, q.delivered = "0.0", 1, Stage.DECODE, 16, [87] * 16
    state.reqs.track(q)

    recovery.resume(q)                       # preempted after 16 tokens: its prompt and outputs prefill anew
    assert q.stage is Stage.PREFILL
    reports.on_step_end(prompt, [("0.0", [87], False, "prefill")], {})   # the first placement's word, late
    assert flow.handed == [] and q.produced == 16
    reports.on_step_end(prompt, [(q.wire, [109], False, "prefill")], {})  # the resumed placement's
    assert flow.handed == [(q.wire, [109])] and q.stage is Stage.HANDOFF and q.produced == 17
