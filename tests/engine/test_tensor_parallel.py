"""Tensor parallelism on the CPU (gloo): the same tokens at tp 2 and 4 as at tp 1, KV handed between
groups of different sizes without loss (re-sharded on the way), and a dead rank taking its group
down instead of hanging it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.kv_memory import InMemoryConnector
from splitserve.engine.parallel import GroupFailed
from splitserve.engine.presets import get_preset
from splitserve.engine.sampler import SamplingParams
from splitserve.engine.sharding import Shard, check_tp
from splitserve.errors import UserError

from hf_checkpoints import make_checkpoint

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)
LAYERWISE, WHOLE = 0, 10**9


def prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(torch.randint(2, 90, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_checkpoint(path, "llama")
    return path


@pytest.mark.parametrize("model", ["small", "hf-llama"])
def test_greedy_tokens_at_tp_2_and_4_equal_tp_1(model, hf_llama):
    name = str(hf_llama) if model == "hf-llama" else model
    ps = prompts(20, 250)
    want = [o.token_ids for o in LLMEngine(name, EngineConfig(num_blocks=256)).generate(ps, GREEDY)]
    for tp in (2, 4):
        eng = LLMEngine(name, EngineConfig(num_blocks=256, tp=tp))
        try:
            got = [o.token_ids for o in eng.generate(ps, GREEDY)]
        finally:
            eng.close()
        assert got == want, f"tp {tp}"


def test_a_rank_loads_only_its_part_of_the_checkpoint(hf_llama):
    eng = LLMEngine(str(hf_llama), EngineConfig(tp=2, num_blocks=16))
    try:
        attn = eng.model.layers[0].self_attn
        # 4 query heads and 2 KV heads of 16: rank 0 holds 2 and 1, and half the 160 MLP columns
        assert (attn.nh, attn.kvh) == (2, 1) and attn.qkv_proj.weight.shape == (4 * 16, 64)
        assert attn.o_proj.weight.shape == (64, 32) and eng.model.layers[0].mlp.down_proj.weight.shape == (64, 80)
        # its cache: 1 head; the contract: 2
        assert eng.kv.data.shape[-2] == 1 and eng.kv_host.kv_layout.num_kv_heads == 2
    finally:
        eng.close()


@pytest.fixture(scope="module")
def two_layer_tp1():
    """The prompts of test_kv_moves_between_groups_of_any_sizes and one tp-1 engine's greedy tokens
    for them: the same for its 8 cases, computed once."""
    ps = prompts(6, 250, seed=1)
    return ps, [o.token_ids for o in LLMEngine("small-2l", EngineConfig(num_blocks=128)).generate(ps, GREEDY)]


@pytest.mark.parametrize("a_tp,b_tp", [(1, 2), (2, 1), (2, 2), (4, 2)])
@pytest.mark.parametrize("threshold", [LAYERWISE, WHOLE], ids=["layerwise", "serialized"])
def test_kv_moves_between_groups_of_any_sizes(a_tp, b_tp, threshold, two_layer_tp1):
    """A prompt engine at tp a prefills, a token engine at tp b decodes: each of b's ranks gets
    its KV heads from those of a's ranks that hold them (through the ranks 0), token for token
    what one engine at tp 1 makes."""
    ps, want = two_layer_tp1
    a_conn, b_conn = InMemoryConnector(threshold=threshold), InMemoryConnector()
    a = LLMEngine("small-2l", EngineConfig(num_blocks=128, tp=a_tp), connector=a_conn)
    b = LLMEngine("small-2l", EngineConfig(num_blocks=128, tp=b_tp), connector=b_conn)
    try:
        firsts = {}
        for i, p in enumerate(ps):  # the first three in one step, the rest one by one
            a_conn.send_to(f"r{i}", b_conn.reserve(f"r{i}", p, GREEDY))
            if i < 3:
                a.add_request(p, GREEDY, f"r{i}", prefill_only=True)
                if i == 2:
                    firsts.update({o.request_id: o.token_ids[0] for o in a.step()})
                    assert len(a.last_shape) == 3  # three prompts streamed / exported by one step
            else:
                firsts[f"r{i}"] = a.prefill_only(p, GREEDY, request_id=f"r{i}").token
        assert len(firsts) == len(ps)
        assert set(b_conn.modes.values()) == {"layerwise" if threshold == LAYERWISE else "serialized"}
        final = {}
        while b.has_unfinished():
            final.update({o.request_id: o.token_ids for o in b.step() if o.finished})
        assert [final[f"r{i}"] for i in range(len(ps))] == want
        assert [firsts[f"r{i}"] for i in range(len(ps))] == [w[0] for w in want]
    finally:
        a.close()
        b.close()


def test_a_dead_rank_takes_the_group_down():
    eng = LLMEngine("tiny", EngineConfig(tp=2, num_blocks=32))
    try:
        eng.generate([[5, 6, 7]], GREEDY)
        follower = eng.ranks.procs[0]
        os.kill(follower.pid, signal.SIGKILL)
        follower.wait(timeout=10)
        eng.add_request([5, 6, 7], GREEDY)
        with pytest.raises(GroupFailed, match="rank 1 exited"):
            eng.step()
    finally:
        eng.close()


def test_close_stops_the_followers():
    eng = LLMEngine("tiny", EngineConfig(tp=4, num_blocks=32))
    procs = list(eng.ranks.procs)
    eng.close()
    assert [p.poll() for p in procs] == [0, 0, 0]


def test_followers_exit_when_rank_0_is_killed():
    code = ("from splitserve.engine.engine import EngineConfig, LLMEngine; import sys, time; "
            "e = LLMEngine('tiny', EngineConfig(tp=2, num_blocks=32)); "
            "print(e.ranks.procs[0].pid, flush=True); time.sleep(60)")
    rank0 = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        follower = int(rank0.stdout.readline())
        rank0.kill()
        rank0.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.path.exists(f"/proc/{follower}") and not _zombie(follower):
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{follower}") or _zombie(follower)
    finally:
        rank0.kill()


def _zombie(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z")
    except OSError:
        return False


def test_a_tp_the_heads_cannot_take_is_refused_in_one_line():
    cfg = get_preset("small")  # 8 query heads, 2 KV heads, 1408 intermediate columns
    check_tp(cfg, 8)
    with pytest.raises(UserError, match=r"tp 3 does not fit this model.*try tp 1, 2, 4, 8") as e:
        check_tp(cfg, 3)
    assert "\n" not in str(e.value)
    # tp 4 > 2 KV heads: each KV head on two ranks, never split
    assert [(s.kv0, s.kv_heads) for s in (Shard.of(cfg, r, 4) for r in range(4))] == [(0, 1), (0, 1), (1, 1), (1, 1)]
    assert Shard.of(cfg, 0, 4).kv_owners(2) == [0, 2]


def test_a_step_larger_than_the_shared_all_reduce_slot():
    """2,100 tokens x 512 hidden x 4 bytes = 4.3 MB per all-reduce: two pieces through the CPU
    ranks' shared-memory slots (4 MiB each), the same tokens as one rank."""
    from splitserve.engine.cpu_allreduce import SLOT_BYTES
    prompt = prompts(1, 32000, seed=4)[0] * 60
    prompt = (prompt * (2100 // len(prompt) + 1))[:2100]
    assert 2100 * 512 * 4 > SLOT_BYTES
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    want = LLMEngine("small-2l", EngineConfig(num_blocks=256)).generate([prompt], params)[0].token_ids
    eng = LLMEngine("small-2l", EngineConfig(num_blocks=256, tp=2))
    try:
        assert eng.generate([prompt], params)[0].token_ids == want
    finally:
        eng.close()
