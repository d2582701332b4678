"""LLMEngine: requests in, tokens out, one batched model step at a time.

    engine = LLMEngine("tiny")   # or a checkpoint directory, a ModelConfig; options: EngineConfig(...)
    rid = engine.add_request([1, 72, 105], SamplingParams(max_tokens=8))
    while engine.has_unfinished():
        for out in engine.step(): ...

The prompt/token split (Splitwise) is two calls on two engines, and engine B continues exactly
where engine A would have (the same greedy tokens, seeded samples and penalties); so does a
request resumed after a preemption elsewhere (`resumed=k`: the last k ids are its outputs):

    first = engine_a.prefill_only(prompt_ids, params)          # PrefillResult: token + KVExport
    rid = engine_b.kv_host.add_request_with_kv(prompt_ids, first.token, first.kv, params)

A step that raises drops its batch's requests and raises StepFailed naming them; the engine stays
usable (`isolated=True` keeps a suspect request out of others' steps). With `tp` > 1 the engine is
rank 0 of a tensor-parallel group (parallel.py): a failed rank raises GroupFailed. KV transfer
goes through `connector` (kv_connector.py). The engine's parts each own their state: `requests`
(live_requests.py), `blocks` (block_manager.py), `scheduler`, `kv_host`, `stream` (kv_stream.py);
its options are one `EngineConfig`.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Callable
from pathlib import Path

import torch

from ..errors import UserError
from ..policy.machine import BatchReport
from .block_manager import BlockManager
from .build import build_weights, default_num_blocks, default_tokenizer, resolve_model
from .config import ModelConfig
from .contract import StepFailed
from .conveniences import generate, prefill_only
from .device import keep_freed_memory, resolve_device, resolve_dtype
from .engine_config import EngineConfig
from .kernels import select_kernels
from .kv_cache import KVAllocator, KVCache, KVExport
from .kv_connector import KVConnector
from .kv_host import EngineKVHost
from .kv_stream import PromptKVStream
from .live_requests import LiveRequests
from .logprobs import handed, prompt_positions, records, score_prompts
from .model_runner import execute, prepare
from .outputs import PrefillResult, RequestOutput
from .parallel import GroupFailed, KVShards, RankSpec, start_group
from .sampler import Sampler, SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence, Status
from .sharding import Shard
from .stopping import finish_text, stop_reason
from .structured import Grammars, consume
from .tokenizer import Tokenizer

__all__ = ["EngineConfig", "LLMEngine", "PrefillResult", "RequestOutput", "StepFailed"]

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, model: str | Path | ModelConfig, config: EngineConfig | None = None, *,
                 kv_alloc: KVAllocator | None = None, connector: KVConnector | None = None) -> None:
        """model: a Hugging Face checkpoint directory, a preset name (random weights from
        `config.weight_seed`; see presets.py) or a ModelConfig. config: its options (default: EngineConfig()).
        kv_alloc: where the KV cache tensor is allocated (default torch.zeros; serve/shm.py puts it
        in memory a peer can map). connector: KV transfer (kv_connector.py), also settable later
        (`engine.connector = c`)."""
        c = self.config = config or EngineConfig()
        self.device = resolve_device(c.device)
        if c.cuda_graphs and self.device.type != "cuda":
            raise UserError("cuda_graphs needs a CUDA device")
        if self.device.type == "cpu":
            keep_freed_memory()
        cfg, path = resolve_model(model)
        self.cfg, shard = cfg, Shard.of(cfg, 0, c.tp)
        self.dtype = resolve_dtype(c.dtype, self.device, cfg)
        self.max_model_len = min(c.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
        self.model = build_weights(cfg, path, self.device, self.dtype, self.max_model_len, shard, c.weight_seed)
        self.model.use_kernels(select_kernels(c.kernels, self.device))
        self.tokenizer: Tokenizer | None = (default_tokenizer(model, path, cfg) if c.tokenizer == "auto"
                                            else c.tokenizer)  # type: ignore[assignment]
        self.eos_ids = set(cfg.eos_token_ids)
        self.grammars = Grammars(lambda: self.tokenizer or default_tokenizer(model, path, cfg), cfg.vocab_size,
                                 cfg.eos_token_ids)
        num_blocks = c.num_blocks or default_num_blocks(cfg, self.dtype, self.device, self.max_model_len,
                                                        c.block_size, c.max_num_seqs, c.kv_cache_bytes, shard.kv_heads)
        self.kv = KVCache(cfg.num_layers, num_blocks, c.block_size, shard.kv_heads, cfg.head_dim,
                          self.dtype, self.device, alloc=kv_alloc)
        self.ranks = self.group = None
        if c.tp > 1:
            self.ranks = start_group(RankSpec(model, self.device.type, self.device.index or 0, self.dtype,
                                              c.weight_seed, self.max_model_len, num_blocks, c.block_size,
                                              torch.get_num_threads(), c.cuda_graphs, c.max_num_seqs, c.kernels), c.tp)
            self.group = self.ranks.group
            self.model.set_reduce(self.group.all_reduce)
            weakref.finalize(self, self.ranks.close)  # also at exit: followers stop quietly
        self.shards = KVShards(self.kv, self.group, shard, cfg.num_kv_heads)
        self.model.bind_kv_cache(self.kv.layers())
        self.blocks = BlockManager(num_blocks, c.block_size, caching=c.prefix_caching)
        self.max_seq_len = min(self.max_model_len, num_blocks * c.block_size)
        batching = c.batching if c.batching.max_seqs else dataclasses.replace(c.batching, max_seqs=c.max_num_seqs)
        self.scheduler = Scheduler(self.blocks, batching)
        self.sampler = Sampler(self.device, c.seed, sorted(self.eos_ids))
        self.graphs = None
        if c.cuda_graphs:
            from .cuda_graph import DecodeGraphs
            self.graphs = DecodeGraphs(self.model, self.kv, c.max_num_seqs, self.blocks.blocks_for(self.max_seq_len))
        self.requests = LiveRequests(cfg, self.max_model_len, self.max_seq_len, num_blocks * c.block_size,
                                     self.tokenizer, self.grammars)
        self.kv_host = EngineKVHost(cfg, self.kv, self.shards, self.blocks, self.scheduler, self.requests,
                                    self.device, self.tokenizer)
        self.stream = PromptKVStream(self.shards, self.blocks, self.kv_host.kv_slot_ids)
        self.stashed: list[RequestOutput] = []  # outputs that go out with the next step
        self.current_batch: list[tuple[Sequence, int]] = []  # the step being run
        self.last_shape: list[tuple[int, int]] = []  # the last step run: (KV tokens before, tokens) per sequence
        self.on_schedule: Callable[[BatchReport], None] | None = None  # called with each step's StepReport before the step runs (a serving worker)
        self.connector = connector

    @property
    def connector(self) -> KVConnector | None:
        return self.kv_host.connector

    @connector.setter
    def connector(self, connector: KVConnector | None) -> None:
        """Attach a KV connector (None: detach): it is bound to this engine's `kv_host`, and the
        engine's own layers get a forward hook that hands it each layer's K/V of streamed prompts."""
        if connector is not None:
            self.stream.hook(self.model.layers)
        self.kv_host.connector = connector
        if connector is not None:
            connector.bind(self.kv_host)

    # ---- requests ----------------------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> list[int]:
        return self.requests.encode(prompt)

    def add_request(self, prompt_ids: list[int] | str, params: SamplingParams | None = None,
                    request_id: str | None = None, prefill_only: bool = False, isolated: bool = False,
                    predicted: int = 0, resumed: int = 0) -> str:
        """Queue a request; returns its id. With prefill_only, the request stops after its first
        token and its output carries the prompt's KV (`finish_reason == "prefill"`). An isolated
        request runs in steps of its own (if it breaks a step, it breaks only its own). predicted:
        its predicted output tokens, for a scheduler that reserves KV by them (ecoserve; 0: none).
        resumed: the last `resumed` ids are outputs it made before a preemption elsewhere."""
        seq = self.requests.new(prompt_ids, params, request_id, isolated, resumed)
        seq.prefill_only = prefill_only
        self.scheduler.add(seq, predicted)
        return seq.request_id

    def abort(self, request_id: str) -> None:
        """Drop a request, and tell the connector (a no-op for one awaiting its KV: the connector
        decides when its blocks go, since a one-sided writer may still be writing into them)."""
        if request_id in self.kv_host.reserved:
            return
        seq = self.requests.by_id.pop(request_id, None)
        if seq is not None and seq.status is not Status.FINISHED:
            self.scheduler.finish(seq)
            if self.connector is not None:
                self.connector.request_dropped(request_id)

    def has_unfinished(self) -> bool:
        self.kv_host.sync_kv()
        return self.scheduler.has_work()

    @property
    def num_preemptions(self) -> int:
        """Decodes this engine preempted since it started."""
        return self.scheduler.num_preemptions

    def check_alive(self) -> None:
        """GroupFailed if a rank of its tensor-parallel group died (nothing to check at tp 1)."""
        if self.ranks is not None:
            self.ranks.check()

    def generate(self, prompts: list[list[int]] | list[str],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run the prompts to completion together; final outputs in prompt order (conveniences.py)."""
        return generate(self, prompts, params)

    def prefill_only(self, prompt_ids: list[int] | str, params: SamplingParams | None = None,
                     request_id: str | None = None, resumed: int = 0) -> PrefillResult:
        """Prefill one prompt now: its first token and the prompt's KV (conveniences.py)."""
        return prefill_only(self, prompt_ids, params, request_id, resumed)

    # ---- one step ----------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Run one batch; outputs for every request that got a token (or finished). StepFailed
        if the batch failed: its requests are aborted, outputs of others wait for the next step."""
        self.kv_host.sync_kv()
        self.last_shape = []
        batch, copies = self.scheduler.schedule()
        for rid in self.scheduler.report.left:   # preempted, to recompute elsewhere (--recompute prompt-pool)
            del self.requests.by_id[rid]
        if self.on_schedule is not None and (batch or self.scheduler.report.told()):
            self.on_schedule(self.scheduler.report)
        new: list[RequestOutput] = []
        if batch:
            told = False  # the connector was told of the step's prompts: it hears of its end
            try:
                told = self.stream.start_step(batch, self.connector)
                new = self._step(batch, copies)
            except Exception as e:  # whatever the step raised becomes StepFailed (or GroupFailed)
                if self.group is not None:  # the ranks may be in different places now
                    raise GroupFailed(f"a tensor-parallel step failed: {e!r}") from e
                self.scheduler.batch = None
                for seq, _ in batch:
                    self.abort(seq.request_id)  # the connector hears of each (request_dropped)
                raise StepFailed([seq.request_id for seq, _ in batch], e) from e
            finally:
                self.stream.end_step(told)
        outputs, self.stashed = self.stashed + new, []
        return outputs

    def _step(self, batch: list[tuple[Sequence, int]], copies: list[tuple[int, int]]) -> list[RequestOutput]:
        """Run a scheduled batch: the model, then a token for each sequence at its last position."""
        batch.sort(key=lambda sn: sn[1] > 1)  # decodes (one token) first
        self.current_batch = batch
        self.last_shape = [(seq.num_computed, n) for seq, n in batch]
        inp, samplers = prepare(self.kv, self.blocks, batch)
        scored = [(seq, prompt_positions(seq, n)) for seq, n in batch if seq.params.prompt_logprobs is not None]
        inp.copies = copies
        exports = [(seq.request_id, self.kv.slots(self.blocks.block_table(seq.request_id), 0, seq.prefix_len))
                   for seq, n in batch if seq.prefill_only and seq.export_kv and seq.num_computed + n >= seq.prefix_len]
        try:
            if self.ranks is not None:  # rank 0 of a group: every follower runs the same step
                self.ranks.check()
                inp.saves = [s.tolist() for s in self.stream.saves.values()]
                inp.exports = [slots for _, slots in exports]
                self.ranks.group.send(("step", inp))
            logits = execute(self.model, self.kv, self.graphs, self.device, inp)
            for rid, slots in exports:  # every rank gathers its heads of each, in this order
                self.stream.exports[rid] = KVExport(self.shards.gather(None, self.shards.slot_tensor(slots)))
        finally:
            self.current_batch = []
        for seq, n in batch:
            seq.num_computed += n
        self.scheduler.step_done()
        if logits is None:  # no row samples a token or scores a prompt
            return []
        if inp.prompt_rows:
            score_prompts(scored, logits[len(inp.rows):])
        if not samplers:
            return []
        if any(s.params.return_logits for s in samplers):
            rows = logits.float().cpu()
            for i, s in enumerate(samplers):
                if s.params.return_logits:
                    s.logits.append(rows[i])
        tokens = self.sampler(self.grammars.mask(logits[:len(inp.rows)], samplers), samplers)
        consume(samplers, tokens)
        wanted = {i: k for i, s in enumerate(samplers) if (k := s.params.logprobs) is not None}
        if wanted:  # one pass over their rows, each keeping its own top N
            scored_out = list(wanted)
            recs = records(logits[scored_out], [tokens[i] for i in scored_out], max(wanted.values()))
            for i, (tok, lp, rank, top) in zip(scored_out, recs):
                samplers[i].logprobs.append((tok, lp, rank, top[:wanted[i]]))
        return [self._append_token(seq, tok) for seq, tok in zip(samplers, tokens)]

    def _append_token(self, seq: Sequence, tok: int) -> RequestOutput:
        seq.output_ids.append(tok)
        reason = stop_reason(seq, tok, self.eos_ids, self.tokenizer)
        kv = None
        if seq.prefill_only:
            kv = self.stream.exports.pop(seq.request_id, None)
            reason = reason or "prefill"
        if reason is not None:
            seq.finish_reason = reason
            seq.text = finish_text(seq, self.tokenizer)
            self.scheduler.finish(seq)
            del self.requests.by_id[seq.request_id]
            if seq.prefill_only and self.connector is not None:
                if reason == "prefill":  # its KV goes on to where it decodes
                    self.connector.request_finished(seq.request_id, tok, kv, handed(seq))
                else:                    # it ended at its first token: nothing to hand over
                    self.connector.request_dropped(seq.request_id)
        return RequestOutput(seq.request_id, seq.prompt_ids, list(seq.output_ids), [tok],
                             reason is not None, reason, seq.text, kv,
                             list(seq.logits) if seq.params.return_logits else None, seq.num_cached,
                             list(seq.logprobs) if seq.params.logprobs is not None else None,
                             seq.prompt_logprobs if seq.params.prompt_logprobs is not None else None)

    def close(self) -> None:
        """Stop the other ranks of a tensor-parallel group (nothing to do at tp 1)."""
        if self.ranks is not None:
            self.ranks.close()
            self.ranks = self.group = None
