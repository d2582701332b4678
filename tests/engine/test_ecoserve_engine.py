"""The live engine runs EcoServe's scheduler (policy/schedulers/ecoserve.py) for real: each prompt
generates token for token what it generates alone, every block comes back, a long request's
reserved blocks are written by the shorter requests it hosts (KV-cache pipelining), and
under-predicted requests take the reserve, are regrouped or recompute."""

from __future__ import annotations

import pytest
import torch

from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.sampler import SamplingParams
from splitserve.policy.machine import BatchingConfig


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(3, 259, (n - 1,), generator=g).tolist() for n in lengths]


# (prompt tokens, max_tokens = tokens made (ignore_eos), predicted output tokens)
# A and B: long and over-predicted; C, E, G, H under-predicted; D, F over. With the engine's
# arrival order as time, A's deadline (0.2 + 0.1 x 30 = 3.2) is the earliest: A hosts first, and
# the short ones fit its slots (29 left: at most 10.15 and 2.9 tokens left).
SPECS = [(20, 24, 30), (20, 24, 30), (10, 12, 8), (12, 6, 8), (14, 12, 3), (16, 3, 3), (18, 12, 8), (9, 12, 3)]
NAMES = "ABCDEFGH"
PROMPTS = prompts([s[0] for s in SPECS])


@pytest.fixture(scope="module")
def alone():
    return [LLMEngine("tiny").generate([p], SamplingParams(max_tokens=s[1], ignore_eos=True))[0].token_ids
            for p, s in zip(PROMPTS, SPECS)]


@pytest.mark.parametrize("num_blocks", [10, 11, 12, 14])
def test_ecoserve_on_the_engine_pipelines_and_survives_mispredictions(alone, num_blocks):
    eng = LLMEngine("tiny", EngineConfig(num_blocks=num_blocks, block_size=16,
                                         batching=BatchingConfig(scheduler="ecoserve", prompt_token_cap=256)))
    lent = []   # (guest, host) whenever a sequence's new block came out of another's pool
    real_append = eng.blocks.append

    def append(seq_id, num_tokens, pool=None):
        before = len(eng.blocks.block_table(seq_id)) if eng.blocks.has(seq_id) else 0
        out = real_append(seq_id, num_tokens, pool)
        if pool is not None and pool != seq_id and len(eng.blocks.block_table(seq_id)) > before:
            lent.append((seq_id, pool))
        return out

    eng.blocks.append = append
    real_schedule = eng.scheduler.schedule

    def schedule():
        out = real_schedule()
        # the step's blocks (tables and pools) are exactly what the policy holds
        held = sum(s.shadow.kv_held for s in eng.scheduler.seqs.values())
        assert (eng.blocks.num_blocks - eng.blocks.num_free) * 16 == held
        return out

    eng.scheduler.schedule = schedule
    for name, p, (_, out, pred) in zip(NAMES, PROMPTS, SPECS):
        eng.add_request(p, SamplingParams(max_tokens=out, ignore_eos=True), name, predicted=pred)
    done = {}
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o.token_ids
        eng.blocks.check()
        m = eng.scheduler.m
        assert (eng.blocks.num_blocks - eng.blocks.num_free) * 16 <= m.kv_used <= m.kv_capacity == num_blocks * 16
    assert done == {n: alone[i] for i, n in enumerate(NAMES)}
    assert eng.blocks.num_free == num_blocks and not eng.blocks.pools.sizes()
    counts = eng.scheduler.m.counts
    assert counts["pipelined"] > 0 and lent            # guests wrote into their host's reserved blocks
    assert counts.get("reserve", 0) + counts.get("regrouped", 0) > 0   # under-predictions handled
    assert eng.scheduler.num_preemptions == counts.get("preempted", 0) + counts.get("unstuck", 0)


def test_without_predictions_ecoserve_reserves_the_output_limit():
    eng = LLMEngine("tiny", EngineConfig(num_blocks=20, block_size=16, batching=BatchingConfig(scheduler="ecoserve")))
    ps = prompts([5, 30, 17])
    want = [LLMEngine("tiny").generate([p], SamplingParams(max_tokens=9, ignore_eos=True))[0].token_ids for p in ps]
    outs = eng.generate(ps, SamplingParams(max_tokens=9, ignore_eos=True))
    assert [o.token_ids for o in outs] == want
    assert eng.blocks.num_free == 20 and not eng.scheduler.m.counts   # nothing lent, nothing grown
