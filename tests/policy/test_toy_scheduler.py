"""Adding a machine-level scheduler is one module and one registry line (policy/schedulers/): a toy
one, shortest prompt first, defined here as a module of policy/schedulers/ would define it and
registered the way policy/schedulers/__init__.py registers every scheduler, runs in the simulator
and in the live engine (engine/scheduler.py) with nothing else added.

    # policy/schedulers/shortest.py (the new file)
    def form_batch(m, cfg): ...                  # order the waiting prompts, then the shared rules
    SCHEDULER = MachineScheduler("shortest", form_batch, "shortest prompt first")
    # policy/schedulers/__init__.py: the registry line (and the module's name in its `from . import`)
    shortest.SCHEDULER,

Here the registry line is the `registered` fixture's monkeypatch.setitem, so the toy leaves the
registry when its test ends.
"""

from __future__ import annotations

import pytest

from splitserve.catalog import load_model
from splitserve.cluster.designs import make_cluster
from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.sampler import SamplingParams
from splitserve.errors import UserError
from splitserve.policy.config import make_policy
from splitserve.policy.machine import BatchingConfig, form_mixed
from splitserve.policy.schedulers import SCHEDULERS
from splitserve.policy.schedulers.base import MachineScheduler
from splitserve.policy.state import Machine
from splitserve.sim.simulator import SimConfig, Simulation
from splitserve.workload import RequestSpec


def shortest_first(m: Machine, cfg: BatchingConfig):
    """Waiting prompts shortest first (a prefill in progress stays first), then the splitwise rules."""
    q = m.prompt_queue
    if len(q) > 1:
        order = [r for r in q if r.prefilled] + sorted((r for r in q if not r.prefilled), key=lambda r: r.prefill_len)
        q.clear()
        q.extend(order)
    return form_mixed(m, cfg)


SHORTEST = MachineScheduler("shortest", shortest_first, "toy: shortest prompt first")


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(SCHEDULERS, SHORTEST.name, SHORTEST)   # the registry line, for this test only


def first_token_order(scheduler: str) -> list[int]:
    """Prompt lengths in the order their first tokens came, on one H100 machine, four requests
    arriving together (4000, 3000, 2000, 1000 prompt tokens, 8 output tokens each)."""
    specs = [RequestSpec(0.0, p, 8) for p in (4000, 3000, 2000, 1000)]
    cfg = SimConfig(record_requests=True, policy=make_policy({"batching.scheduler": scheduler}))
    sim = Simulation(make_cluster("baseline-h100", machines=1), load_model("llama2-70b"), specs, cfg)
    sim.run()
    done = sorted(sim.kept, key=lambda r: r.first_token_at)
    assert all(r.generated == 8 for r in done)
    return [r.prompt_tokens for r in done]


def test_a_toy_scheduler_runs_in_the_simulator(registered):
    # the first arrival finds the machine idle and starts at once, alone; the 2048-token cap then
    # runs each waiting prompt alone (the first prompt of an iteration runs however long, the next
    # does not fit what is left), in queue order: by arrival (FCFS), or shortest first under the toy
    assert first_token_order("splitwise") == [4000, 3000, 2000, 1000]
    assert first_token_order("shortest") == [4000, 1000, 2000, 3000]


def test_a_toy_scheduler_runs_in_the_engine(registered):
    # prompts of 40, 30, 20 and 10 tokens, a 16-token cap: one prompt a step, shortest first
    prompts = [[1] + [5 + i] * (n - 1) for i, n in enumerate((40, 30, 20, 10))]
    eng = LLMEngine("tiny", EngineConfig(batching=BatchingConfig(scheduler="shortest", prompt_token_cap=16)))
    chunks = []
    real = eng.step

    def step():
        out = real()
        chunks.extend(n for _, n in eng.scheduler.report.chunks)
        return out
    eng.step = step
    outs = eng.generate(prompts, SamplingParams(max_tokens=3, ignore_eos=True))
    assert chunks == [10, 20, 30, 40]
    assert [len(o.token_ids) for o in outs] == [3, 3, 3, 3]
    assert eng.blocks.num_free == eng.blocks.num_blocks


def test_the_registry_is_the_one_place_a_name_is_known(registered):
    assert make_policy({"batching.scheduler": "shortest"}).batching.scheduler == "shortest"
    with pytest.raises(UserError, match="--chunk-size applies to"):
        make_policy({"batching.scheduler": "shortest", "batching.chunk_size": 64})   # it does not chunk


def test_the_toy_is_gone_after_its_test():
    assert "shortest" not in SCHEDULERS
    with pytest.raises(UserError, match="--machine-scheduler must be one of"):
        make_policy({"batching.scheduler": "shortest"})
