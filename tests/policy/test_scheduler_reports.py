"""A machine scheduler checks its own step report as it comes off the wire (the codec sees an opaque
list): the router drops a step whose report is malformed, as it drops any malformed message.
Each kind of damage to an EcoServe report fails with its reason; the reports its Sizing makes on
random workloads pass (tests/serve/test_cluster_state.py checks every one)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitserve.policy.schedulers import SCHEDULERS

ECO = SCHEDULERS["ecoserve"]
GOOD = [[["a", "b"]], ["c"], [["b", 16]], [["d", 32, "b"]], ["e"]]


def test_a_scheduler_that_reports_nothing_accepts_only_nothing():
    assert SCHEDULERS["splitwise"].check_report(None) is None
    assert SCHEDULERS["splitwise"].check_report([]) == "this machine scheduler reports nothing"


def test_ecoserve_accepts_what_sizing_encodes():
    assert ECO.check_report(None) is None
    assert ECO.check_report(GOOD) is None
    assert ECO.check_report([[], [], [], [], []]) is None


@pytest.mark.parametrize("rep, why", [
    ([[], [], [], []], "sched: expected a list of 5 lists"),
    ("x", "sched: expected a list of 5 lists"),
    ([{}, [], [], [], []], "sched.rehosted: expected a list"),
    ([[["a"]], [], [], [], []], "sched.rehosted: item 0 is not a record of 2 fields as it should be"),
    ([[], [3], [], [], []], "sched.parked: item 0 is not a request id"),
    ([[], [], [["b", 0]], [], []], "sched.grown: item 0 is not a record of 2 fields as it should be"),
    ([[], [], [["b", True]], [], []], "sched.grown: item 0 is not a record of 2 fields as it should be"),
    ([[], [], [["b", 1.5]], [], []], "sched.grown: item 0 is not a record of 2 fields as it should be"),
    ([[], [], [], [["d", 32, 7]], []], "sched.resumed: item 0 is not a record of 3 fields as it should be"),
    ([[], [], [], [["d", 0, "b"]], []], "sched.resumed: item 0 is not a record of 3 fields as it should be"),
    ([[], [], [], [], [None]], "sched.planned: item 0 is not a request id"),
])
def test_ecoserve_names_what_is_malformed(rep, why):
    assert ECO.check_report(rep) == why


@given(st.lists(st.lists(st.text(max_size=3), max_size=3), min_size=5, max_size=5))
def test_ecoserve_never_raises_on_a_list_of_five_lists(rep):
    assert ECO.check_report(rep) is None or ECO.check_report(rep).startswith("sched.")
