"""The live engine runs every named machine-level scheduler (policy/schedulers/): tokens as each
prompt alone, every block returned, and under KV pressure (preemption where the scheduler
preempts)."""

from __future__ import annotations

import pytest
import torch

from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.sampler import SamplingParams
from splitserve.policy.machine import BatchingConfig
from splitserve.policy.schedulers import SCHEDULERS

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(3, 259, (n - 1,), generator=g).tolist() for n in lengths]


MIXED = prompts([1, 5, 17, 33, 64, 3, 120])   # as tests/engine/test_engine.py


@pytest.fixture(scope="module")
def sequential():
    return [LLMEngine("tiny").generate([p], GREEDY)[0].token_ids for p in MIXED]


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_scheduler_runs_on_the_engine(sequential, name):
    for num_blocks in (None, 12):   # ample KV, then 192 slots for ~440 tokens of work
        eng = LLMEngine("tiny", EngineConfig(num_blocks=num_blocks, block_size=16, max_num_seqs=4,
                                             batching=BatchingConfig(scheduler=name, prompt_token_cap=64)))
        assert [o.token_ids for o in eng.generate(MIXED, GREEDY)] == sequential
        assert eng.blocks.num_free == eng.blocks.num_blocks
        if num_blocks and name in ("splitwise", "vllm", "sarathi"):
            assert eng.scheduler.num_preemptions > 0
        elif name in ("orca", "fastertransformer", "lightllm"):
            assert eng.scheduler.num_preemptions == 0
