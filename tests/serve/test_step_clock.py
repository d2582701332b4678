"""When a request's queue time ends (vllm:request_queue_time_seconds): at its first engine step, as
the worker that formed it timed it (`step`'s `at`) when the worker shares the router's clock (the
same boot id), else when the router reads the report. A report read after the request's first
token (the token worker's `kv_in` overtook it) still places the step on a shared clock; without
one that request has no queue time (splitserve_requests_schedule_unseen_total)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from splitserve.policy.schedulers import SCHEDULERS
from splitserve.serve.messages import Hello, Step, StepChunk, WireParams
from splitserve.serve.protocol import boot_id
from splitserve.serve.reports import ReportReader
from splitserve.serve.router_state import RouterState
from splitserve.serve.supervisor import WorkerInfo


class Reports(ReportReader):
    """The router's report handlers over a request table, with its view and metrics muted."""

    def __init__(self, boot: str | None) -> None:
        cluster = SimpleNamespace(step_started=lambda *a: [], view=SimpleNamespace(up=lambda *a: None),
                                  sched=SCHEDULERS["splitwise"])
        state = RouterState(cfg=None, metrics=SimpleNamespace(step=lambda *a: None), chan=None, boot=boot,
                            workers=[], sup=SimpleNamespace(hello=lambda *a: True), cluster=cluster)
        super().__init__(state, flow=None, recovery=None)
        self.reqs = state.reqs

    def request(self, wire: str, first_at: float = 0.0):
        q = self.reqs.new("cmpl-x", [1, 2, 3], WireParams(max_tokens=4, temperature=0.0, top_p=1.0, top_k=0,
                                                         ignore_eos=True, stop_token_ids=[]), 0.0)
        q.wire, q.first_at = wire, first_at
        self.reqs.by_wire[wire] = q
        return q


def hello(boot: str | None) -> Hello:
    return Hello(worker_id=0, pid=1, kv_addr="tcp://h:1", blocks=8, block_size=16, free=8, max_len=64, boot=boot)


def test_a_worker_of_the_same_boot_shares_the_clock_and_another_does_not():
    r = Reports("boot-a")
    same, other, unknown = (WorkerInfo(i, "prompt") for i in range(3))
    r.on_hello(same, hello("boot-a"))
    r.on_hello(other, hello("boot-b"))
    r.on_hello(unknown, hello(None))
    assert (same.same_clock, other.same_clock, unknown.same_clock) == (True, False, False)
    assert not Reports(None).on_hello(w := WorkerInfo(3, "prompt"), hello(None)) and not w.same_clock


def test_the_step_is_placed_when_the_worker_formed_it():
    r, w = Reports("b"), WorkerInfo(0, "prompt", same_clock=True)
    formed = time.perf_counter() - 0.25                     # the report was read 250 ms after
    q = r.request("1.0")
    r.on_message(w, Step(chunks=[StepChunk("1.0", 3)], preempted=[], at=formed))
    assert q.scheduled_at == formed
    r.on_message(w, Step(chunks=[StepChunk("1.0", 3)], preempted=[], at=formed + 1))   # a later chunk
    assert q.scheduled_at == formed                         # the first step counts
    # a clock ahead of the router's (it cannot be, on one boot) is held to the moment it is read
    q2 = r.request("2.0")
    r.on_message(w, Step(chunks=[StepChunk("2.0", 3)], preempted=[], at=time.perf_counter() + 60))
    assert q2.scheduled_at <= time.perf_counter()


@pytest.mark.parametrize("same_clock", [True, False])
def test_a_report_overtaken_by_the_first_token(same_clock):
    r, w = Reports("b"), WorkerInfo(0, "prompt", same_clock=same_clock)
    formed = time.perf_counter() - 0.5
    q = r.request("1.0", first_at=formed + 0.2)              # kv_in came first
    r.on_message(w, Step(chunks=[StepChunk("1.0", 3)], preempted=[], at=formed))
    assert q.scheduled_at == (formed if same_clock else 0.0)    # 0: counted unseen at completion


def test_without_a_clock_the_report_is_placed_when_read():
    r, w = Reports("b"), WorkerInfo(0, "prompt", same_clock=False)
    q = r.request("1.0")
    before = time.perf_counter()
    r.on_message(w, Step(chunks=[StepChunk("1.0", 3)], preempted=[], at=1.0))
    assert before <= q.scheduled_at <= time.perf_counter()


def test_this_hosts_boot_id_is_stable():
    b = boot_id()
    assert b == boot_id() and (b is None or len(b) >= 16)
