"""The CUDA-graph runner's bucketing and padding, checked on any device: graph capture is
replaced by running the same captured function eagerly, so padded rows, the null block and the
bucket views are exercised without a GPU (test_engine_cuda.py does the real capture)."""

from __future__ import annotations

import torch

from splitserve.engine.cuda_graph import DecodeGraphs
from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.sampler import SamplingParams


class _Replay:
    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self):
        self.out.copy_(self.fn())


class EagerGraphs(DecodeGraphs):
    def _capture(self, b, nb):
        out = self._forward(b, nb)
        self.graphs[(b, nb)] = _Replay(lambda: self._forward(b, nb), out)
        self.outputs[(b, nb)] = out


def test_bucketing():
    eng = LLMEngine("tiny", EngineConfig(max_num_seqs=20))
    g = EagerGraphs(eng.model, eng.kv, max_batch=20, max_blocks=32)
    assert g.batch_sizes == [1, 2, 4, 8, 16, 20]
    assert g.bucket(3, 1) == (4, 8) and g.bucket(17, 9) == (20, 16) and g.bucket(1, 32) == (1, 32)
    assert g.bucket(21, 1) is None and g.bucket(1, 33) is None


def test_padded_replays_equal_plain_decode():
    prompts = [[1] + [(11 * i + j) % 250 + 3 for j in range(n)] for i, n in enumerate([3, 30, 8, 60, 1, 17, 140])]
    params = SamplingParams(max_tokens=20, ignore_eos=True, return_logits=True)
    ref = LLMEngine("tiny").generate(prompts, params)
    eng = LLMEngine("tiny", EngineConfig(max_num_seqs=6, num_blocks=24, block_size=8))  # also preempts
    eng.graphs = EagerGraphs(eng.model, eng.kv, max_batch=6, max_blocks=eng.blocks.blocks_for(eng.max_seq_len))
    outs = eng.generate(prompts, params)
    assert len(eng.graphs.graphs) >= 3 and eng.scheduler.num_preemptions > 0
    for r, o in zip(ref, outs):
        assert o.token_ids == r.token_ids
    assert eng.blocks.num_free == 24


def test_capture_all_takes_every_reachable_bucket_and_writes_only_the_null_block():
    eng = LLMEngine("tiny", EngineConfig(max_num_seqs=6, num_blocks=24, block_size=8))
    eng.kv.data.normal_()  # cache contents that a stray write would change
    before = eng.kv.data.clone()
    g = EagerGraphs(eng.model, eng.kv, max_batch=6, max_blocks=20)
    reachable = {g.bucket(b, n) for b in range(1, 7) for n in range(1, 21)}
    assert sorted(reachable) == g.buckets() and len(reachable) == 4 * 3  # batches 1, 2, 4, 6; blocks 8, 16, 20
    g.capture_all()
    assert set(g.graphs) == reachable
    null = eng.kv.null_block
    assert torch.equal(eng.kv.data[:, :, :null], before[:, :, :null])
