"""BENCHMARK TOOL, never the default: an engine stand-in that returns tokens without computing.

`splitserve serve --worker-mode echo` runs workers on this instead of `LLMEngine`, so that a load
test measures the front end, the router and the worker channel alone (benchmarks/serve/
router_overhead.py). Token i of a request is `(last prompt id + 1 + i) % vocab`; all of them come
out in the step after the request arrives. It implements the Engine protocol the worker uses
(engine/contract.py) and is its own KV host, with a KV cache of zero layers (a split request's
"transfer" is just the closing message), and reports its steps as the engine does (a prompt's
one chunk when it starts, a decode that joins).
Like the engine, it calls its KV connector (engine/kv_connector.py): a prefill handed over or
dropped, the reservations complete or let go; it streams nothing (no layers).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..engine.kv_connector import KVConnector, KVLayout
from ..errors import UserError
from ..policy.machine import BatchReport


@dataclass
class EchoOutput:
    request_id: str
    token_ids: list[int]
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    kv: object = None
    logprobs: None = None         # never computed here (serve refuses logprobs with --worker-mode echo)
    prompt_logprobs: None = None
    prompt_token_ids: list[int] = field(default_factory=list)  # not kept


@dataclass
class _Cfg:
    num_layers: int = 0
    vocab_size: int = 259

    @staticmethod
    def kv_bytes_per_token(itemsize: int) -> int:
        return 0


@dataclass
class _Blocks:
    num_blocks: int = 1 << 20
    block_size: int = 16
    num_free: int = 1 << 20


@dataclass
class EchoEngine:
    cfg: _Cfg = field(default_factory=_Cfg)
    blocks: _Blocks = field(default_factory=_Blocks)
    max_model_len: int = 1 << 16
    token_delay_s: float = 0.0  # > 0: one token per request per step, and each step sleeps this long
    on_schedule: Callable[[BatchReport], None] | None = None  # called with each step's BatchReport
    connector: KVConnector | None = None          # bound by the worker
    kv_layout: KVLayout = KVLayout(0, 0, 0, None, 16)
    device: None = None                           # it holds no KV
    last_shape: list = field(default_factory=list)  # never a shape: no step log
    num_preemptions: int = 0
    _queue: dict = field(default_factory=dict)   # rid -> (first token, count, prefill_only, done)
    _new: dict = field(default_factory=dict)     # rid -> prompt tokens (first step not run yet), or 0: joins
    _reserved: dict = field(default_factory=dict)

    def add_request(self, ids: list[int], params, request_id: str | None = None, prefill_only: bool = False,
                    isolated: bool = False, predicted: int = 0, resumed: int = 0) -> str:
        if request_id is None:
            raise ValueError("the echo engine needs the worker's request id")
        self._queue[request_id] = ((ids[-1] + 1) % self.cfg.vocab_size, params.max_tokens, prefill_only, 0)
        self._new[request_id] = len(ids)
        return request_id

    @property
    def kv_host(self) -> EchoEngine:
        return self

    def check_alive(self):
        pass  # one process: nothing else to die

    def kv_slot_ids(self, block_ids, num_tokens):
        raise UserError("the echo engine holds no KV cache")

    def reserve_kv(self, prompt_ids, params, rid, isolated=False, resumed=0):
        self.sync_kv()
        self._reserved[rid] = params
        return []

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        if name == "connector" and value is not None:
            value.bind(self)

    def sync_kv(self):
        c = self.connector
        if c is None:
            return
        news = c.get_finished()
        for rid in news.freed:
            self.release_kv(rid)
        for rid, first in news.loaded:
            if rid in self._reserved:
                self.start_reserved(rid, first)
                c.load_started(rid, None)
            else:
                c.load_started(rid, f"request {rid!r} has no KV reservation")

    def write_kv_layer(self, rid, layer, data, start=0):
        pass

    def kv_cached(self, rid):
        return 0  # no cache: every transfer is whole

    def release_kv(self, rid):
        return self._reserved.pop(rid, None) is not None

    def start_reserved(self, request_id, first_token):
        params = self._reserved.pop(request_id)
        self._queue[request_id] = (first_token, params.max_tokens, False, 1)
        self._new[request_id] = 0

    def abort(self, rid):
        self._new.pop(rid, None)
        if self._queue.pop(rid, None) is not None and self.connector is not None:
            self.connector.request_dropped(rid)

    def has_unfinished(self):
        self.sync_kv()
        return bool(self._queue)

    @property
    def num_reserved(self):
        return len(self._reserved)

    def step(self):
        self.sync_kv()
        if self._new and self.on_schedule is not None:
            self.on_schedule(BatchReport(chunks=[(r, n) for r, n in self._new.items() if n],
                                        joined=[r for r, n in self._new.items() if not n]))
        self._new = {}
        outs = []
        v = self.cfg.vocab_size
        if self.token_delay_s > 0:
            time.sleep(self.token_delay_s)
        for rid, (first, n, prefill_only, done) in list(self._queue.items()):
            if prefill_only:
                outs.append(EchoOutput(rid, [first], [first], True, "prefill" if n > 1 else "length"))
                del self._queue[rid]
                if self.connector is not None:  # serialized, of zero layers: just the closing message
                    if n > 1:
                        self.connector.request_finished(rid, first, None)
                    else:
                        self.connector.request_dropped(rid)
                continue
            stop = n if self.token_delay_s <= 0 else done + 1
            toks = [(first + i) % v for i in range(done, stop)]
            finished = stop >= n
            outs.append(EchoOutput(rid, toks, toks, finished, "length" if finished else None))
            if finished:
                del self._queue[rid]
            else:
                self._queue[rid] = (first, n, False, stop)
        return outs
