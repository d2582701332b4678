"""How the simulator times a step of a measured machine (twin/machine.py): co-run, time-sharing
of the host's cores with the other workers and the background load (the serving path, the client,
KV transfers), and the step overhead, hand-computed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from splitserve.sim.kv_transfer import Link
from splitserve.twin.machine import MachineProfile


def _machine(cores=2):
    facts = {"host_cores": cores, "block_size": 16, "corun": {"prompt": 0.1, "token": 0.2},
             "path": {"step_overhead_s": 0.001, "background_cpu_s": 0.02}}
    return MachineProfile(name="m", facts=facts, perf=None, model=SimpleNamespace(kv_bytes_per_token=1000),
                          link=Link(bandwidth=1e9, overhead=0.001), transport="tcp")


def test_background_is_the_serving_paths_cpu_at_the_rate():
    m = _machine()
    assert m.background_cores == 0.0
    assert m.under_load(5.0).background_cores == pytest.approx(5 * 0.02)
    # a split design also moves each prompt's KV: 1 ms + 1,000 tokens x 1,000 bytes at 1 GB/s
    assert m.transfer_s(1000) == pytest.approx(0.002)
    assert m.under_load(5.0, moved_tokens=1000).background_cores == pytest.approx(5 * 0.022)


def test_step_time_by_hand():
    m = _machine().under_load(5.0)  # 0.1 cores of background
    # alone: 1 worker + 0.1 on 2 cores, no sharing; the step overhead
    assert m.step_time(0.1, prompt=True, others_busy=0) == pytest.approx(0.101)
    # another worker computes: co-run +10% (prompt), and 2.1 cores wanted of 2
    assert m.step_time(0.1, prompt=True, others_busy=1) == pytest.approx(0.1 * 1.1 * 2.1 / 2 + 0.001)
    assert m.step_time(0.1, prompt=False, others_busy=1) == pytest.approx(0.1 * 1.2 * 2.1 / 2 + 0.001)
    # without background the two workers fit their two cores
    assert _machine().step_time(0.1, prompt=False, others_busy=1) == pytest.approx(0.1 * 1.2 + 0.001)
    # one core: any background slows even a lone step
    assert _machine(cores=1).under_load(5.0).step_time(0.1, True, 0) == pytest.approx(0.1 * 1.1 + 0.001)
