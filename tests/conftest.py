"""Test tiers. Every test is in one: `live` (starts servers or other processes), `slow` (in one
process, but long), or `unit` (the rest: what a developer runs every few minutes,
`python -m pytest -m unit`). They are marked here when the tests are collected:

- live: a test that uses a fixture that starts a server (LIVE_FIXTURES), or whose module starts
  processes or servers or names such a fixture (its source names subprocess, multiprocessing, a
  process pool, Ray, serve's start_server, bench's fake_server (uvicorn in a thread) or a live
  fixture, which a test may ask for by name: SPAWNS);
- either, by test id in NODE_TIERS (what the rules above miss: a process pool, a long test);
- slow: marked `slow` by hand;
- unit: the rest. A unit test that starts a Python process or a multiprocessing worker anyway fails
  (`no_processes_in_unit_tests`), so no test sits in the wrong tier unnoticed.
"""

from __future__ import annotations

import multiprocessing.process
import os
import re
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest


def _triton_interpreter_without_cuda() -> None:
    """Where triton is installed and there is no CUDA device, turn Triton's interpreter on before
    anything imports triton (transformers does): triton.language wraps its own jit functions
    (tl.zeros, tl.max, ...) at import, interpreted only if TRITON_INTERPRET is set then. The
    engine's kernel tests (tests/engine/test_triton_*.py) then run on CPU tensors."""
    if find_spec("triton") is None or find_spec("torch") is None:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


_triton_interpreter_without_cuda()

LIVE_FIXTURES = {"server_factory", "split_server", "split_2x2_server", "single_server",
                 "profile_dir"}   # the live twin tests' profiled machine (tests/twin/conftest.py)
SPAWNS = re.compile("|".join((
    r"\bsubprocess\b", r"\bPopen\b", r"multiprocessing", r"ProcessPool", r"\bimport ray\b", r"\bray\.init\b",
    r"\bstart_server\b", r"\brun_live\b", r"\bfake_server\b", r"uvicorn\.(Server|run)\b",
    r"--workers\"?, \"?[2-9]", *(rf"\b{name}\b" for name in LIVE_FIXTURES))))
# by test id (a prefix: a module, a test, a parametrized case): tests the rules above miss
NODE_TIERS = {
    # process pools (provision's and compare's --workers default to the cores)
    "tests/compare/test_compare.py": "live",
    "tests/provision/test_configs.py::test_capacities_and_front_equal_brute_force": "live",
    "tests/provision/test_estimate.py": "live",
    "tests/reproduce/test_distserve.py": "live",
    "tests/engine/test_prefix_cache.py::test_tensor_parallel_and_ecoserve_engines_share_prefixes": "live",
    # in one process, the longest of a unit run (--durations on the 2-core VM, 2026-12-07)
    "tests/reproduce/test_reproduce.py::test_report_has_every_section_plots_and_ratios": "slow",
    "tests/serve/test_cluster_state.py::test_the_router_view_follows_ecoserve_event_by_event": "slow",
    "tests/twin/test_twin_replay.py": "slow",
    "tests/engine/test_scheduler.py::test_the_view_covers_every_block_and_tokens_are_unchanged": "slow",
    "tests/reproduce/test_aladdin_search.py": "slow",
    "tests/sim/test_histogram.py::test_buckets_quantiles_and_merge_follow_the_definition": "slow",
    "tests/compare/test_explain.py": "slow",
}
TIERS = ("unit", "live", "slow")


def tier(item: pytest.Item, spawns: dict[Path, bool]) -> str:
    listed = [t for prefix, t in NODE_TIERS.items() if item.nodeid.startswith(prefix)]
    if listed:
        return listed[0]
    path = Path(str(item.fspath))
    if path not in spawns:
        spawns[path] = bool(SPAWNS.search(path.read_text()))
    if spawns[path] or LIVE_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "live"
    if item.get_closest_marker("slow"):
        return "slow"
    return "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    spawns: dict[Path, bool] = {}
    for item in items:
        found = [t for t in TIERS if item.get_closest_marker(t)]
        item.add_marker(found[0] if found else tier(item, spawns))


def _refuse(what: str):
    pytest.fail(f"a unit test started {what}: it belongs in the live tier (tests/conftest.py SPAWNS "
                "or LIVE_FIXTURES)", pytrace=False)


@pytest.fixture(autouse=True)
def no_processes_in_unit_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """In a unit test, starting a Python process (splitserve's workers, a CLI) or a multiprocessing
    worker fails the test. Other programs (a compiler probe, ldconfig) are left alone."""
    if request.node.get_closest_marker("unit") is None:
        return
    popen_init = subprocess.Popen.__init__

    def guarded_popen(self, args, *a, **kw):
        argv = [args] if isinstance(args, (str, bytes)) else list(args)
        if argv and (str(argv[0]) == sys.executable or "splitserve" in str(argv[0])):
            _refuse(f"a process ({' '.join(map(str, argv))[:120]})")
        popen_init(self, args, *a, **kw)

    def guarded_start(self):
        _refuse(f"a multiprocessing worker ({self.name})")

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_popen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", guarded_start)
