"""The prompt side of a KV hand-over, during one engine step: which prompts of the step stream
their K/V to the connector layer by layer (a forward hook on each of the engine's layers hands it
each layer's K/V of them), and the whole K/V of the others, gathered at the step's end for their
outputs (engine.py `_append_token`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .block_manager import BlockManager
from .kv_cache import KVExport
from .kv_connector import KVConnector, PromptChunk
from .parallel import KVShards
from .sequence import Sequence

SlotIds = Callable[[list[int], int], torch.Tensor]


class PromptKVStream:
    """The running step's streamed prompts (`saves`: request id -> slot ids) and whole exports
    (`exports`: request id -> KVExport), both emptied when the step ends."""

    def __init__(self, shards: KVShards, blocks: BlockManager, slot_ids: SlotIds) -> None:
        self.shards, self.blocks, self.slot_ids = shards, blocks, slot_ids
        self.saves: dict[str, torch.Tensor] = {}
        self.exports: dict[str, KVExport] = {}
        self._to: KVConnector | None = None  # the connector the running step streams to
        self._hooked = False

    def hook(self, layers: torch.nn.ModuleList) -> None:
        """Hook the engine's own layers (once): each hands its K/V of the streamed prompts on."""
        if not self._hooked:
            for i, layer in enumerate(layers):
                layer.register_forward_hook(self._layer_hook(i))
            self._hooked = True

    def start_step(self, batch: list[tuple[Sequence, int]], connector: KVConnector | None) -> bool:
        """A step starts: tell the connector its prompt chunks, note the prompts it streams.
        Whether it was told (the step then ends with `end_step(True)`)."""
        if connector is None:
            return False
        chunks = [PromptChunk(seq.request_id, n, seq.prefix_len, seq.num_computed + n >= seq.prefix_len)
                  for seq, n in batch if seq.num_computed < seq.prefix_len]
        if not chunks:
            return False
        self._to = connector
        streamed = connector.start_step(chunks)
        if streamed:
            for seq, n in batch:
                p = seq.prefix_len
                if seq.request_id in streamed and seq.num_computed + n >= p:
                    seq.export_kv = False  # streamed layer by layer: no whole-cache copy at the step's end
                    self.saves[seq.request_id] = self.slot_ids(self.blocks.block_table(seq.request_id), p)
        return True

    def end_step(self, told: bool) -> None:
        """The step is over (run or failed): forget its prompts; the connector hears of it if it
        was told of the step's start."""
        self.saves, self.exports = {}, {}
        to, self._to = self._to, None
        if told and to is not None:
            to.end_step()

    def _layer_hook(self, i: int):
        def hook(module, args, output):
            saves = self.saves
            if saves:  # whole heads: every rank of a tensor-parallel group gathers its own to rank 0
                self._to.save_layer(i, {rid: self.shards.gather(i, slots) for rid, slots in saves.items()})
        return hook
