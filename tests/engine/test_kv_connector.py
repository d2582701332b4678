"""The KV-connector contract (engine/kv_connector.py) with its in-memory reference implementation:
a request handed from engine A (prompt) to engine B (token) decodes exactly as on one engine, in
both transfer modes and with chunked prefill; every failure path frees what it holds; and the
engine calls the contract in the documented order."""

from __future__ import annotations

import time

import pytest
import torch

from splitserve.engine.engine import EngineConfig, LLMEngine, StepFailed
from splitserve.engine.kv_connector import KVFinished, PromptChunk
from splitserve.engine.kv_memory import InMemoryConnector, InMemoryWhere
from splitserve.engine.sampler import SamplingParams
from splitserve.errors import UserError
from splitserve.policy.machine import BatchingConfig

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.9, top_p=0.9, top_k=40, seed=7)
PROMPT = [1] + [(13 * i) % 250 + 3 for i in range(52)]  # 53 tokens: 4 blocks, 4 chunks of 16
LAYERWISE, WHOLE = 0, 10**9  # thresholds: every step streams / none does


def alone(prompt, params):
    return LLMEngine("tiny").generate([prompt], params)[0].token_ids


def pair(threshold=LAYERWISE, chunk_size=0, timeout_s=None, a_cls=InMemoryConnector):
    a_conn, b_conn = a_cls(threshold=threshold), InMemoryConnector(timeout_s=timeout_s)
    a = LLMEngine("tiny", EngineConfig(seed=11, batching=BatchingConfig(chunk_size=chunk_size)), connector=a_conn)
    b = LLMEngine("tiny", EngineConfig(seed=22))
    b.connector = b_conn  # attached after construction works too
    return a, a_conn, b, b_conn


def drain(eng) -> dict[str, list[int]]:
    """Step `eng` to the end; the final tokens of each request that finished."""
    final = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                final[out.request_id] = out.token_ids
    return final


def all_free(*engines) -> bool:
    for e in engines:
        e.kv_host.sync_kv()
        e.blocks.check()
    return all(e.blocks.num_free == e.blocks.num_blocks and e.kv_host.num_reserved == 0 for e in engines)


# ---- a request handed over, token for token -----------------------------------------------------
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("threshold,mode", [(LAYERWISE, "layerwise"), (WHOLE, "serialized")])
@pytest.mark.parametrize("chunk_size", [0, 16], ids=["whole-prompt", "chunked"])
def test_a_prefills_b_decodes_as_one_engine(params, threshold, mode, chunk_size):
    want = alone(PROMPT, params)
    a, a_conn, b, b_conn = pair(threshold, chunk_size)
    b.add_request([1, 60, 70], GREEDY, "b-other")   # both engines are busy with other requests
    b.step()
    a.add_request([1, 80, 90, 100], SamplingParams(max_tokens=5), "a-other")
    where = b_conn.reserve("r", PROMPT, params)
    assert b.kv_host.num_reserved == 1 and not b_conn.get_finished()
    a_conn.send_to("r", where)
    first = a.prefill_only(PROMPT, params, request_id="r")
    assert first.finish_reason == "prefill"
    assert (first.kv is None) == (mode == "layerwise")  # streamed: no whole-cache copy made
    assert b_conn.modes == {"r": mode} and b_conn.incoming == {}  # complete: waiting for B to start it
    assert b.kv_host.num_reserved == 1 and b_conn.events == []
    final = drain(b)
    assert [first.token] + final["r"][1:] == want and final["r"] == want
    assert b_conn.events == [("kv_in", "r", mode)] and b_conn.stray == 0
    assert drain(a)["a-other"] == alone([1, 80, 90, 100], SamplingParams(max_tokens=5))
    assert all_free(a, b) and not a_conn.plans


def test_many_requests_both_ways():
    """Two engines, each the other's prompt and token side, several requests in flight."""
    x_conn, y_conn = InMemoryConnector(threshold=40), InMemoryConnector(threshold=40)
    x, y = LLMEngine("tiny", connector=x_conn), LLMEngine("tiny", connector=y_conn)
    prompts = {f"r{i}": [1] + [(7 * i + 3 * j) % 250 + 3 for j in range(10 + 9 * i)] for i in range(6)}
    final = {}

    def step_both():
        for eng in (x, y):
            for out in eng.step():
                if out.finished and out.finish_reason != "prefill":
                    final[out.request_id] = out.token_ids

    for i, (rid, p) in enumerate(prompts.items()):  # one arrives per step, alongside the others' decodes
        src, dst_conn = (x, y_conn) if i % 2 else (y, x_conn)
        src.connector.send_to(rid, dst_conn.reserve(rid, p, GREEDY))
        src.add_request(p, GREEDY, rid, prefill_only=True)
        step_both()
    while x.has_unfinished() or y.has_unfinished():
        step_both()
    assert final == {rid: alone(p, GREEDY) for rid, p in prompts.items()}
    modes = {e[1]: e[2] for e in x_conn.events + y_conn.events}
    assert set(modes.values()) == {"layerwise", "serialized"}  # 40 prompt tokens per step decide
    assert all_free(x, y)


# ---- failure paths -------------------------------------------------------------------------------
def test_a_request_dropped_before_its_kv_went_frees_the_reservation():
    a, a_conn, b, b_conn = pair(LAYERWISE, chunk_size=16)
    a_conn.send_to("r", b_conn.reserve("r", PROMPT, GREEDY))
    a.add_request(PROMPT, GREEDY, "r", prefill_only=True)
    a.step()                               # its first chunk ran
    assert b.kv_host.num_reserved == 1
    a.abort("r")                           # the router dropped it: nothing more goes to B
    assert not a_conn.plans and not a.has_unfinished()
    assert not b.has_unfinished() and all_free(a, b)
    assert b_conn.events == [] and b_conn.incoming == {}


def test_a_failed_step_drops_its_prompts_transfers(monkeypatch):
    a, a_conn, b, b_conn = pair(LAYERWISE)
    a_conn.send_to("r", b_conn.reserve("r", PROMPT, GREEDY))
    a.add_request(PROMPT, GREEDY, "r", prefill_only=True)
    real = a.model.layers[1].forward

    def boom(*args, **kwargs):  # layer 0 has been streamed to B when layer 1 breaks
        raise RuntimeError("boom")
    monkeypatch.setattr(a.model.layers[1], "forward", boom)
    with pytest.raises(StepFailed):
        a.step()
    monkeypatch.setattr(a.model.layers[1], "forward", real)
    assert not a_conn.plans and not a_conn.streaming
    assert all_free(a, b) and b_conn.incoming == {}


def test_a_request_that_ends_at_its_first_token_hands_nothing_over():
    a, a_conn, b, b_conn = pair(WHOLE)
    params = SamplingParams(max_tokens=1)
    a_conn.send_to("r", b_conn.reserve("r", PROMPT, params))
    first = a.prefill_only(PROMPT, params, request_id="r")
    assert first.finished and first.finish_reason == "length"
    assert all_free(a, b) and b_conn.events == [] and not b.has_unfinished()


def test_a_released_reservation_takes_no_kv():
    a, a_conn, b, b_conn = pair(LAYERWISE)
    a_conn.send_to("r", b_conn.reserve("r", PROMPT, GREEDY))
    assert b_conn.release("r") and not b_conn.release("r")
    assert all_free(b)
    a.prefill_only(PROMPT, GREEDY, request_id="r")  # its KV arrives for no reservation: ignored
    assert b_conn.stray == 2 + 1  # two layers, then the closing call
    assert all_free(a, b) and b_conn.events == [] and not b.has_unfinished()


def test_a_reservation_that_never_completes_times_out():
    a, a_conn, b, b_conn = pair(timeout_s=0.05)
    b_conn.reserve("r", PROMPT, GREEDY)
    assert not b.has_unfinished() and b.kv_host.num_reserved == 1
    time.sleep(0.06)
    assert not b.has_unfinished()  # the engine asked, the connector let the blocks go
    assert b_conn.events == [("kv_fail", "r", "timed out after 0.05 s")] and all_free(b)


def test_a_request_that_cannot_start_is_reported_and_freed():
    a, a_conn, b, b_conn = pair(WHOLE)
    # B was told the request makes one token: A's first token already ends it there
    a_conn.send_to("r", b_conn.reserve("r", PROMPT, SamplingParams(max_tokens=1)))
    a.prefill_only(PROMPT, GREEDY, request_id="r")
    assert not b.has_unfinished()
    ((kind, rid, why),) = b_conn.events
    assert (kind, rid) == ("kv_fail", "r") and "first token" in why
    assert all_free(a, b)


def test_a_reservation_that_does_not_fit_is_refused():
    b = LLMEngine("tiny", EngineConfig(num_blocks=4), connector=(conn := InMemoryConnector()))
    conn.reserve("r", PROMPT, GREEDY)  # 53 + 11 tokens: the whole cache
    with pytest.raises(UserError, match="no room"):
        conn.reserve("s", PROMPT[:5], GREEDY)
    assert list(conn.incoming) == ["r"] and b.kv_host.num_reserved == 1
    assert conn.release("r") and all_free(b)
    conn.reserve("s", PROMPT[:5], GREEDY)  # the blocks let go are free for the next one at once


# ---- the host side of the contract ---------------------------------------------------------------
def test_host_methods_check_what_they_are_given():
    b = LLMEngine("tiny", EngineConfig(block_size=4))
    layout = b.kv_host.kv_layout
    assert (layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.block_size) == (2, 2, 16, 4)
    assert layout.bytes_per_token == 2 * 2 * 2 * 16 * 4 and layout.layer_shape(3) == (2, 3, 2, 16)
    assert b.kv_host.kv_slot_ids([5, 2], 6).tolist() == [20, 21, 22, 23, 8, 9]
    with pytest.raises(ValueError, match="do not hold"):
        b.kv_host.kv_slot_ids([5], 6)
    ok = torch.zeros(2, 6, 2, 16)
    with pytest.raises(UserError, match="no KV reservation"):
        b.kv_host.write_kv_layer("nobody", 0, ok)
    blocks = b.kv_host.reserve_kv(list(range(1, 7)), GREEDY, "r")
    assert len(blocks) == 2  # 6 prompt tokens and the first token, in blocks of 4
    for layer, data in ((2, ok), (0, torch.zeros(2, 9, 2, 16)), (0, torch.zeros(2, 6, 3, 16)), (0, ok[0])):
        with pytest.raises(UserError, match="does not fit"):
            b.kv_host.write_kv_layer("r", layer, data)
    b.kv_host.write_kv_layer("r", 1, ok + 1)
    slots = b.kv_host.kv_slot_ids(blocks, 6)
    assert torch.equal(b.kv.data[1].view(2, -1, 2, 16)[:, slots], ok + 1)
    assert b.kv_host.release_kv("r") and all_free(b)


# ---- the order of the calls -----------------------------------------------------------------------
class Recording(InMemoryConnector):
    """The reference connector, noting each call of the contract (get_finished only when it has news)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.calls: list[tuple] = []

    def bind(self, host):
        self.calls.append(("bind",))
        super().bind(host)

    def start_step(self, prompts):
        self.calls.append(("start_step", [(p.request_id, p.num_tokens, p.last) for p in prompts]))
        streamed = super().start_step(prompts)
        self.calls[-1] += (sorted(streamed),)
        return streamed

    def save_layer(self, layer, kv):
        self.calls.append(("save_layer", layer, {rid: tuple(t.shape) for rid, t in kv.items()}))
        super().save_layer(layer, kv)

    def end_step(self):
        self.calls.append(("end_step",))
        super().end_step()

    def request_finished(self, request_id, first_token, export, logprobs=None):
        self.calls.append(("request_finished", request_id, export is None))
        super().request_finished(request_id, first_token, export, logprobs)

    def request_dropped(self, request_id):
        self.calls.append(("request_dropped", request_id))
        super().request_dropped(request_id)

    def get_finished(self):
        news = super().get_finished()
        if news:
            self.calls.append(("get_finished", news.loaded, news.freed))
        return news

    def load_started(self, request_id, error):
        self.calls.append(("load_started", request_id, error))
        super().load_started(request_id, error)


@pytest.mark.parametrize("threshold", [LAYERWISE, WHOLE], ids=["layerwise", "serialized"])
def test_the_prompt_side_is_called_in_the_documented_order(threshold, monkeypatch):
    a, a_conn, b, b_conn = pair(threshold, chunk_size=32, a_cls=Recording)
    a_conn.send_to("r", b_conn.reserve("r", PROMPT, GREEDY))
    a.add_request(PROMPT, GREEDY, "r", prefill_only=True)
    drain(a)
    kv = (2, len(PROMPT), 2, 16)
    last_step = ([("save_layer", 0, {"r": kv}), ("save_layer", 1, {"r": kv}), ("request_finished", "r", True)]
                 if threshold == LAYERWISE else [("request_finished", "r", False)])
    assert a_conn.calls == [
        ("bind",),
        ("start_step", [("r", 32, False)], []), ("end_step",),           # a chunk: nothing to send yet
        ("start_step", [("r", 21, True)], ["r"] if threshold == LAYERWISE else []),
        *last_step,
        ("end_step",),
    ]
    mode = "layerwise" if threshold == LAYERWISE else "serialized"
    assert b_conn.events == [] and b.has_unfinished() and b_conn.events == [("kv_in", "r", mode)]
    drain(b)

    # a failed step: each of its requests dropped, then its end
    a.add_request(PROMPT[20:40], GREEDY, "f", prefill_only=True)  # shares no block with PROMPT (cached)
    a_conn.calls.clear()

    def boom(*args, **kwargs):
        raise RuntimeError("boom")
    monkeypatch.setattr(a.model.layers[1], "forward", boom)
    with pytest.raises(StepFailed):
        a.step()
    monkeypatch.undo()
    assert a_conn.calls == [("start_step", [("f", 20, True)], []), ("request_dropped", "f"), ("end_step",)]
    # an abort of a live request
    a.add_request(PROMPT, GREEDY, "g", prefill_only=True)
    a_conn.calls.clear()
    a.abort("g")
    assert a_conn.calls == [("request_dropped", "g")]
    # decodes only: the connector hears nothing
    a.add_request([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True), "h")
    a.step()
    a_conn.calls.clear()
    a.step()
    assert a_conn.calls == []
    assert all_free(b)


def test_the_token_side_is_called_in_the_documented_order():
    a, a_conn, b, _ = pair(LAYERWISE)
    b.connector = b_conn = Recording()
    b_conn.reserve("r", PROMPT, GREEDY)
    b_conn.reserve("x", PROMPT, GREEDY)
    a_conn.send_to("r", InMemoryWhere(b_conn, "r"))
    a.prefill_only(PROMPT, GREEDY, request_id="r")
    b_conn.release("x")
    b_conn.calls.clear()
    outs = b.step()  # the step that finds it loaded runs it
    assert b_conn.calls == [("get_finished", [("r", outs[0].token_ids[0])], ["x"]), ("load_started", "r", None)]
    assert [o.request_id for o in outs] == ["r"] and len(outs[0].token_ids) == 2
    assert b.scheduler.report.joined == ["r"]
    drain(b)
    assert all_free(a, b)


def test_prompt_chunks_name_what_finishes():
    seen = []

    class Spy(InMemoryConnector):
        def start_step(self, prompts: list[PromptChunk]):
            seen.append(prompts)
            return ()

    a = LLMEngine("tiny", EngineConfig(batching=BatchingConfig(chunk_size=20)), connector=Spy())
    a.add_request(PROMPT, GREEDY, "p", prefill_only=True)
    drain(a)
    assert seen == [[PromptChunk("p", 20, 53, False)], [PromptChunk("p", 20, 53, False)],
                    [PromptChunk("p", 13, 53, True)]]
    assert KVFinished() == KVFinished([], []) and not KVFinished()

