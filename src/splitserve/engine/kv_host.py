"""The token side of a KV hand-over between processes (Splitwise's prompt -> token transfer): the
KVHost a KV connector works through (kv_connector.py), a part of LLMEngine (`engine.kv_host`).

`reserve_kv` holds what the request's decode will hold here (the policy's reservation,
engine/scheduler.py) and allocates its prompt positions, `write_kv_layer` fills them, and
`start_reserved` starts the decode from the first token made elsewhere; `release_kv` drops a
reservation. `add_request_with_kv` does all of it at once with a whole exported KV. `sync_kv`
applies the connector's news before each step. K/V comes and goes with every KV head (`shards`:
the group's heads at tensor parallel > 1).
"""

from __future__ import annotations

import torch

from ..errors import UserError
from .block_manager import BlockManager
from .config import ModelConfig
from .kv_cache import KVCache, KVExport
from .kv_connector import KVConnector, KVLayout
from .live_requests import LiveRequests
from .parallel import KVShards
from .sampler import SamplingParams
from .scheduler import Scheduler
from .stopping import stop_reason
from .tokenizer import Tokenizer


class EngineKVHost:
    """An engine's KV reservations for requests prefilled elsewhere (`reserved`: their ids), over
    the engine's cache, blocks, scheduler and live requests. `connector`: the engine's (set by
    `LLMEngine.connector`)."""

    def __init__(self, cfg: ModelConfig, kv: KVCache, shards: KVShards, blocks: BlockManager, scheduler: Scheduler,
                 requests: LiveRequests, device: torch.device, tokenizer: Tokenizer | None) -> None:
        self.cfg, self.kv, self.shards, self.blocks, self.scheduler = cfg, kv, shards, blocks, scheduler
        self.requests, self.device, self.tokenizer = requests, device, tokenizer
        self.eos_ids = set(cfg.eos_token_ids)
        self.connector: KVConnector | None = None
        self.reserved: set[str] = set()  # requests whose blocks await a KV transfer

    @property
    def kv_layout(self) -> KVLayout:
        return KVLayout(self.cfg.num_layers, self.cfg.num_kv_heads, self.cfg.head_dim, self.kv.data.dtype,
                        self.blocks.block_size)

    def kv_slot_ids(self, block_ids: list[int], num_tokens: int) -> torch.Tensor:
        """Slot ids of positions 0..num_tokens of a sequence holding `block_ids` in a cache of this
        engine's layout (block size): KVHost's, for a one-sided writer into a peer's cache too."""
        if len(block_ids) * self.blocks.block_size < num_tokens:
            raise ValueError(f"{len(block_ids)} blocks do not hold {num_tokens} tokens")
        return torch.tensor(self.kv.slots(block_ids, 0, num_tokens), dtype=torch.long, device=self.device)

    def sync_kv(self) -> None:
        """Apply the connector's news (`get_finished`): start the complete reservations, free the
        ones it lets go. The engine's `step()`, `has_unfinished()` and `reserve_kv()` call it first."""
        c = self.connector
        if c is None:
            return
        news = c.get_finished()
        if not news:
            return
        for rid in news.freed:
            self.release_kv(rid)
        for rid, first in news.loaded:
            try:
                self.start_reserved(rid, first)
            except UserError as e:
                self.release_kv(rid)
                c.load_started(rid, str(e))
            else:
                c.load_started(rid, None)

    def add_request_with_kv(self, prompt_ids: list[int], first_token: int, kv: KVExport,
                            params: SamplingParams | None = None, request_id: str | None = None,
                            isolated: bool = False, resumed: int = 0) -> str:
        """Continue a request prefilled elsewhere: reserve its KV (UserError if it does not fit),
        import the prompt's KV, then decode from `first_token` on. isolated, resumed: as in
        `LLMEngine.add_request`."""
        if kv.num_tokens != len(prompt_ids):
            raise UserError(f"KV covers {kv.num_tokens} tokens but the prompt has {len(prompt_ids)}")
        expect = (self.cfg.num_layers, 2, self.cfg.num_kv_heads, self.cfg.head_dim)
        got = (kv.num_layers, kv.data.shape[1], *kv.data.shape[3:])
        if got != expect:
            raise UserError(f"KV shape (layers, 2, kv_heads, head_dim) {got} does not match this model's {expect}")
        rid = self._reserve(prompt_ids, params, request_id, isolated, resumed)
        self.shards.write(None, self.kv.slots(self.blocks.block_table(rid), 0, kv.num_tokens), kv.data)
        self.start_reserved(rid, first_token)
        return rid

    # ---- KV received layer by layer (a streamed transfer) -----------------------------------
    def reserve_kv(self, prompt_ids: list[int], params: SamplingParams | None, request_id: str,
                   isolated: bool = False, resumed: int = 0) -> list[int]:
        """Before an incoming request's KV arrives: reserve what its decode will hold here (the
        policy's reservation) and allocate the blocks of its prompt positions (the last `resumed`
        of them outputs it made before a preemption) and next token; their ids. UserError when it
        does not fit (NoRoom: not now). The connector's news is applied first (blocks it let go
        are free for this one)."""
        self.sync_kv()
        rid = self._reserve(prompt_ids, params, request_id, isolated, resumed)
        return self.blocks.block_table(rid)

    def _reserve(self, prompt_ids: list[int], params: SamplingParams | None, request_id: str | None,
                 isolated: bool, resumed: int = 0) -> str:
        seq = self.requests.new(prompt_ids, params, request_id, isolated, resumed)
        try:
            self.scheduler.reserve(seq)
        except UserError:
            del self.requests.by_id[seq.request_id]
            raise
        if self.blocks.caching:  # its longest cached prefix, below the last prompt token, is not sent
            self.scheduler.attach_cached(seq, seq.prefix_len)
        self.blocks.append(seq.request_id, seq.prefix_len + 1)  # within the reservation
        self.reserved.add(seq.request_id)
        return seq.request_id

    def kv_cached(self, request_id: str) -> int:
        """A reservation's leading prompt tokens already in this engine's prefix cache (not sent)."""
        seq = self.requests.by_id.get(request_id)
        return seq.num_computed if seq is not None and request_id in self.reserved else 0

    def write_kv_layer(self, request_id: str, layer: int, data: torch.Tensor, start: int = 0) -> None:
        """Write layer `layer`'s K/V (2, tokens, kv_heads, head_dim) of positions start.. into a
        reservation. UserError for no reservation, or a layer or shape that does not fit it."""
        if request_id not in self.reserved:
            raise UserError(f"request {request_id!r} has no KV reservation")
        expect = (2, self.cfg.num_kv_heads, self.cfg.head_dim)
        n = data.shape[1] if data.dim() == 4 else -1
        if (not 0 <= layer < self.cfg.num_layers or data.dim() != 4 or (data.shape[0], *data.shape[2:]) != expect
                or start < 0 or start + n > self.requests.by_id[request_id].prefix_len + 1):
            raise UserError(f"KV of layer {layer}, shape {tuple(data.shape)} from position {start} does not fit "
                            f"request {request_id!r}")
        self.shards.write(layer, self.kv.slots(self.blocks.block_table(request_id), start, start + n), data)

    def release_kv(self, request_id: str) -> bool:
        """Drop a reservation whose transfer failed; True if there was one."""
        if request_id not in self.reserved:
            return False
        self.reserved.discard(request_id)
        self.scheduler.finish(self.requests.by_id.pop(request_id))
        return True

    def start_reserved(self, request_id: str, first_token: int) -> str:
        """Every layer of a reservation has been written: decode from `first_token` on."""
        if request_id not in self.reserved:
            raise UserError(f"request {request_id!r} has no KV reservation")
        seq = self.requests.by_id[request_id]
        if not 0 <= first_token < self.cfg.vocab_size:
            self.release_kv(request_id)
            raise UserError(f"first token {first_token} is outside the vocabulary")
        seq.output_ids.append(first_token)
        if seq.matcher is not None:
            seq.matcher.consume_token(first_token)
        if stop_reason(seq, first_token, self.eos_ids, self.tokenizer) is not None:
            self.release_kv(request_id)
            raise UserError("the request already finished at its first token; nothing to decode")
        self.reserved.discard(request_id)
        seq.num_computed = seq.prefix_len
        self.scheduler.arrived(seq)
        return request_id

    @property
    def num_reserved(self) -> int:
        return len(self.reserved)

    def export_kv(self, request_id: str) -> KVExport:
        """The K/V of every position of a live request that has been computed so far."""
        seq = self.requests.by_id.get(request_id)
        if seq is None or not self.blocks.has(request_id):
            raise UserError(f"request {request_id!r} holds no KV in this engine")
        return KVExport(self.shards.read(None, self.kv.slots(self.blocks.block_table(request_id), 0, seq.num_computed)))
