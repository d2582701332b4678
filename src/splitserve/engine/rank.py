"""A follower rank (1..tp-1) of a tensor-parallel engine: its shard of the model and of the KV
cache, and a loop that does what rank 0 says (parallel.py): run a step (the same forward, its
part of every all-reduce, its heads of the KV that rank 0 streams or exports), write or read KV.

    python -m splitserve.engine.rank RANK SIZE PORT DEVICE  (started by parallel.start_group;
                                                             DEVICE: cpu, or cuda:N for this rank)
"""

from __future__ import annotations

import logging
import os
import sys

import torch

from ..logs import configure as configure_logging
from .build import build_weights, resolve_model
from .device import keep_freed_memory
from .kernels import select_kernels
from .kv_cache import KVCache
from .model_runner import StepInputs, execute
from .parallel import Group, KVShards, RankSpec, die_with_parent, rank_device
from .sharding import Shard

logger = logging.getLogger(__name__)


class Follower:
    def __init__(self, group: Group, spec: RankSpec) -> None:
        self.group = group
        cfg, path = resolve_model(spec.model)
        shard = Shard.of(cfg, group.rank, group.size)
        dev = self.device = rank_device(spec, group.rank)
        if dev.type == "cpu":
            keep_freed_memory()  # as rank 0 does (engine.py): no page faults on each step's activations
        self.model = build_weights(cfg, path, dev, spec.dtype, spec.max_model_len, shard, spec.weight_seed)
        self.model.use_kernels(select_kernels(spec.kernels, dev))
        self.model.set_reduce(group.all_reduce)
        self.kv = KVCache(cfg.num_layers, spec.num_blocks, spec.block_size, shard.kv_heads, cfg.head_dim,
                          spec.dtype, dev)
        self.model.bind_kv_cache(self.kv.layers())
        self.shards = KVShards(self.kv, group, shard, cfg.num_kv_heads)
        self.graphs = None
        if spec.cuda_graphs:
            from .cuda_graph import DecodeGraphs
            max_blocks = -(-min(spec.max_model_len, spec.num_blocks * spec.block_size) // spec.block_size)
            self.graphs = DecodeGraphs(self.model, self.kv, spec.max_num_seqs, max_blocks)
        self.saves: list[torch.Tensor] = []
        for i, layer in enumerate(self.model.layers):
            layer.register_forward_hook(self._save_hook(i))

    def _save_hook(self, i: int):
        def hook(module, args, output):
            for slots in self.saves:  # rank 0 gathers each streamed prompt's heads in this order
                self.shards.gather(i, slots)
        return hook

    @torch.inference_mode()
    def run(self) -> None:
        while True:
            cmd = self.group.receive()
            match cmd[0]:
                case "step":
                    self.step(cmd[1])
                case "write":
                    _, layer, slots, shape = cmd
                    whole = self.group.broadcast(torch.empty(shape, dtype=self.kv.data.dtype, device=self.device))
                    self.shards.put_local(layer, self.shards.slot_tensor(slots), whole)
                case "read":
                    self.shards.gather(cmd[1], self.shards.slot_tensor(cmd[2]))
                case "stop":
                    return

    def step(self, inp: StepInputs) -> None:
        self.saves = [self.shards.slot_tensor(slots) for slots in inp.saves]
        try:
            execute(self.model, self.kv, self.graphs, self.device, inp, logits=False)
        finally:
            self.saves = []
        for slots in inp.exports:  # as rank 0: one gather per prompt whose KV goes whole
            self.shards.gather(None, self.shards.slot_tensor(slots))


def main(argv: list[str]) -> int:
    configure_logging()  # the level its worker was given (SPLITSERVE_LOG_LEVEL, logs.py)
    die_with_parent()
    rank, size, port = map(int, argv[:3])
    store = torch.distributed.TCPStore("127.0.0.1", port, size, False)
    try:
        group = Group(store, rank, size, torch.device(argv[3]))
        if group.shm_reduce is not None:  # a CPU group
            parent = os.getppid()
            group.shm_reduce.alive = lambda: os.getppid() == parent
        _, spec = group.receive()
        torch.set_num_threads(spec.threads)
        Follower(group, spec).run()
        group.close()
    except (RuntimeError, OSError) as e:  # rank 0 is gone (its channel closed) or a collective failed
        logger.error("tensor-parallel rank %d: %s", rank, repr(e)[:500])
        return 1
    except Exception:  # noqa: BLE001 -- the follower's process boundary: anything else is a bug, logged whole
        logger.exception("tensor-parallel rank %d failed", rank)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
