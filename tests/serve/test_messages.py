"""The typed messages (serve/messages.py): every kind round trips through encode, msgpack and
decode (and through a real Codec); every malformed variant is refused with a reason that names the
kind and the field; the headers today's code builds by hand decode; the docstring's table lists
every kind and field."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.serve import messages as M
from splitserve.serve.messages import (
    KV,
    MESSAGES,
    TO_ROUTER,
    TO_WORKER,
    WIRE_NAMES,
    Abort,
    Cancel,
    Err,
    Expect,
    Gen,
    Heartbeat,
    Hello,
    KvDone,
    KvDrop,
    KvFail,
    KvIn,
    KvLayer,
    KvStart,
    MalformedMessage,
    Message,
    Out,
    OutItem,
    PeerDown,
    Ping,
    Reserved,
    Stage,
    Step,
    StepChunk,
    StepFailed,
    Stop,
    WireParams,
    decode,
    encode,
)
from splitserve.serve.protocol import Codec, worker_identity

SECRET = b"0123456789abcdef0123456789abcdef"
W1 = worker_identity(SECRET, 1, 1).decode()


def wire(msg: Message) -> dict:
    """encode, then through msgpack as Codec sends it: what a receiver's decode gets."""
    return msgpack.unpackb(msgpack.packb(encode(msg), use_bin_type=True), raw=False)


def refused(header, kinds=None) -> MalformedMessage:
    with pytest.raises(MalformedMessage) as e:
        decode(header, kinds)
    assert isinstance(e.value, ValueError) and e.value.reason == str(e.value)
    return e.value


# ---- strategies: valid instances of every kind -----------------------------------------------------
U64 = 2**64 - 1
rid = st.text(max_size=24)
nat = st.integers(0, U64)
ids = st.lists(st.integers(0, U64), max_size=40)
small_ids = st.lists(st.integers(0, 2**32 - 1), max_size=8)
finite = st.floats(allow_nan=False, allow_infinity=False)
finite_nn = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
mode = st.sampled_from(["layerwise", "serialized"])
opaque = st.dictionaries(st.text(max_size=8), st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), U64), finite, st.text(max_size=8), small_ids), max_size=6)
meta = st.fixed_dictionaries({"num_layers": nat, "num_tokens": nat, "num_kv_heads": nat, "head_dim": nat,
                              "dtype": st.text(max_size=10)})

params = st.builds(
    WireParams, max_tokens=st.integers(1, U64), temperature=finite_nn, top_p=finite,
    top_k=st.integers(-1, U64), ignore_eos=st.booleans(), stop_token_ids=small_ids,
    seed=st.none() | st.integers(-(2**63), U64), presence_penalty=finite, frequency_penalty=finite,
    repetition_penalty=finite, logit_bias=st.lists(st.tuples(st.integers(0, U64), finite), max_size=4),
    logprobs=st.none() | st.integers(0, 20), prompt_logprobs=st.none() | st.integers(0, 20))
record = st.tuples(nat, finite | st.just(-math.inf), st.integers(1, U64),
                   st.lists(st.tuples(nat, finite).map(list), max_size=3)).map(list)
records = st.none() | st.lists(record, max_size=3)
lp = st.tuples(records, records).map(list)

gen_full = st.builds(Gen, rid=rid, prompt_ids=ids, params=params, kind=st.just("full"), isolated=st.booleans(),
                     predicted=st.none() | st.integers(1, U64), resumed=st.none() | st.integers(1, U64))
gen_prefill = st.builds(Gen, rid=rid, prompt_ids=ids, params=params, kind=st.just("prefill"),
                        isolated=st.booleans(), dest=nat, dest_ident=st.text(max_size=30),
                        dest_addr=st.text(max_size=30), threshold=nat, region=st.none() | opaque,
                        blocks=st.none() | ids, skip=st.none() | nat, resumed=st.none() | st.integers(1, U64))

KINDS: dict[type, st.SearchStrategy] = {
    Gen: gen_full | gen_prefill,
    Expect: st.builds(Expect, rid=rid, prompt_ids=ids, params=params, src=nat, isolated=st.booleans(),
                      resumed=st.none() | st.integers(1, U64)),
    Cancel: st.builds(Cancel, rid=rid),
    Abort: st.builds(Abort, rid=rid, prefill_sent=st.booleans()),
    PeerDown: st.builds(PeerDown, peer=nat),
    Ping: st.builds(Ping),
    Stop: st.builds(Stop),
    Hello: st.builds(Hello, worker_id=nat, pid=nat, kv_addr=st.text(max_size=30), blocks=nat,
                     block_size=st.integers(1, U64), free=nat, max_len=st.integers(1, U64),
                     region=st.none() | opaque),
    Heartbeat: st.builds(Heartbeat, worker_id=nat, free=nat, blocks=nat, reserved=nat, running=nat, rejected=nat,
                         stray=nat, preempted=nat),
    Out: st.builds(Out, items=st.lists(st.builds(OutItem, rid, ids, st.booleans(), st.none() | st.text(max_size=10)),
                                       max_size=8), lp=st.none() | st.dictionaries(rid, lp, max_size=3)),
    Reserved: st.builds(Reserved, rid=rid, ok=st.booleans(), blocks=st.none() | ids,
                        msg=st.none() | st.text(max_size=20), skip=st.none() | nat, full=st.none() | st.booleans()),
    KvIn: st.builds(KvIn, rid=rid, first_token=nat, nbytes=nat, mode=mode, seconds=finite_nn, exposed=finite_nn,
                    lp=st.none() | lp, skipped=st.none() | nat),
    KvFail: st.builds(KvFail, rid=rid, reason=st.text(max_size=40)),
    Err: st.builds(Err, rid=rid, msg=st.text(max_size=40)),
    StepFailed: st.builds(StepFailed, rids=st.lists(rid, max_size=6), error=st.text(max_size=40)),
    Step: st.builds(Step, chunks=st.lists(st.builds(StepChunk, rid, nat), max_size=6),
                    preempted=st.lists(rid, max_size=6), joined=st.lists(rid, max_size=6),
                    sched=st.none() | st.lists(st.lists(rid, max_size=3), max_size=5),
                    grown=st.none() | st.lists(rid, max_size=6)),
    KvStart: st.builds(KvStart, rid=rid),
    KvLayer: st.builds(KvLayer, rid=rid, layer=nat, sent_at=finite_nn, inplace_bytes=st.none() | nat),
    KvDone: st.builds(KvDone, rid=rid, first_token=nat, prefill_end=finite_nn, mode=mode, sent_at=finite_nn,
                      meta=st.none() | meta, inplace_bytes=st.none() | nat, fail=st.none() | st.text(max_size=20),
                      lp=st.none() | lp),
    KvDrop: st.builds(KvDrop, rid=rid),
}
any_message = st.one_of(*KINDS.values())


def test_every_kind_has_a_strategy_and_a_direction():
    assert set(KINDS) == set(MESSAGES.values())
    assert TO_WORKER | TO_ROUTER | KV == set(MESSAGES)
    assert len(TO_WORKER) + len(TO_ROUTER) + len(KV) == len(MESSAGES)
    assert TO_WORKER == {"gen", "expect", "cancel", "abort", "peer_down", "ping", "stop"}
    assert TO_ROUTER == {"hello", "hb", "out", "reserved", "kv_in", "kv_fail", "err", "step_failed", "step"}
    assert KV == {"kvs", "kvl", "kvd", "kvx"}
    for cls in MESSAGES.values():
        params = cls.__dataclass_params__
        assert params.frozen and cls.__slots__ is not None and issubclass(cls, Message)


# ---- round trips -----------------------------------------------------------------------------------
@settings(max_examples=400, deadline=None)
@given(any_message)
def test_round_trip_through_msgpack(msg):
    h = encode(msg)
    assert type(h) is dict and h["t"] == msg.T
    assert all(v is not None for v in h.values())  # None fields are left out
    got = decode(msgpack.unpackb(msgpack.packb(h, use_bin_type=True), raw=False))
    assert got == msg and type(got) is type(msg)
    assert decode(h) == msg  # in-process too (tuples where msgpack makes lists)
    assert decode({**h, "_from": "w1"}) == msg  # the Codec's sender key is ignored


@settings(max_examples=200, deadline=None)
@given(any_message)
def test_decoded_values_have_the_declared_types(msg):
    got = decode(wire(msg))
    for f in dataclasses.fields(got):
        v = getattr(got, f.name)
        if isinstance(v, float) or f.name in ("seconds", "exposed", "sent_at", "prefill_end"):
            assert type(v) is float
        if isinstance(v, list):
            assert type(v) is list
    if isinstance(got, Out):
        assert all(type(it) is OutItem and type(it.tokens) is list for it in got.items)
    if isinstance(got, Step):
        assert all(type(c) is StepChunk for c in got.chunks)
    if isinstance(got, (Gen, Expect)):
        assert type(got.params) is WireParams
        assert all(type(p) is tuple for p in got.params.logit_bias)


@settings(max_examples=100, deadline=None)
@given(params)
def test_params_leave_defaults_out(p):
    d = p.to_wire()
    assert {"max_tokens", "temperature", "top_p", "top_k", "ignore_eos", "stop_token_ids"} <= set(d)
    assert ("seed" in d) == (p.seed is not None)
    assert ("presence_penalty" in d) == (p.presence_penalty != 0.0)
    assert ("frequency_penalty" in d) == (p.frequency_penalty != 0.0)
    assert ("repetition_penalty" in d) == (p.repetition_penalty != 1.0)
    assert ("logit_bias" in d) == bool(p.logit_bias)
    assert M.params_from_wire(msgpack.unpackb(msgpack.packb(d))) == p


def test_ints_are_taken_as_floats():
    h = wire(KvIn(rid="1.0", first_token=5, nbytes=10, mode="layerwise", seconds=0.5, exposed=0.0))
    got = decode({**h, "seconds": 2, "exposed": 0})
    assert got.seconds == 2.0 and type(got.seconds) is float and type(got.exposed) is float


def test_nil_optional_fields_are_their_default():
    # today's worker sends "region": None on tcp, and reserved without blocks or msg
    hello = decode({"t": "hello", "id": 0, "pid": 42, "kv": "tcp://127.0.0.1:1", "blocks": 10, "block_size": 16,
                    "free": 10, "max_len": 512, "region": None})
    assert hello.region is None and hello.worker_id == 0 and hello.kv_addr == "tcp://127.0.0.1:1"
    assert "region" not in encode(hello)
    assert decode({"t": "reserved", "rid": "1.0", "ok": True}) == Reserved(rid="1.0", ok=True)


def test_tuples_become_lists():
    p = WireParams(max_tokens=1, temperature=0.0, top_p=1.0, top_k=0, ignore_eos=False, stop_token_ids=(2, 3),
                   logit_bias=[[5, 1]])
    got = decode({"t": "expect", "rid": "1.0", "ids": (1, 2), "p": p.to_wire(), "src": 0})
    assert got.prompt_ids == [1, 2] and type(got.prompt_ids) is list
    assert got.params.stop_token_ids == [2, 3] and got.params.logit_bias == [(5, 1.0)]
    assert got.isolated is False


def test_out_and_step_encode_their_records_as_arrays():
    out = Out(items=[OutItem("1.0", [5, 6], False, None), OutItem("2.0", [7], True, "length")])
    assert msgpack.unpackb(msgpack.packb(encode(out))) == {
        "t": "out", "items": [["1.0", [5, 6], False, None], ["2.0", [7], True, "length"]]}
    step = Step(chunks=[StepChunk("1.0", 512)], preempted=["2.0"], joined=["3.0"])
    assert msgpack.unpackb(msgpack.packb(encode(step))) == {"t": "step", "chunks": [["1.0", 512]],
                                                             "preempted": ["2.0"], "joined": ["3.0"]}
    one, two = (decode({"t": "step", "chunks": [], "preempted": []}) for _ in range(2))
    assert one.joined == [] and one.joined is not two.joined  # a new list each time
    # the router's loop over items works unchanged
    assert [(r, t, f, why) for r, t, f, why in decode(wire(out)).items] == [
        ("1.0", [5, 6], False, None), ("2.0", [7], True, "length")]


def test_wire_names():
    h = encode(Gen(rid="3.1", prompt_ids=[1, 2], params=WireParams(
        max_tokens=4, temperature=0.0, top_p=1.0, top_k=0, ignore_eos=False, stop_token_ids=[]), kind="prefill",
        isolated=True, dest=2, dest_ident=W1, dest_addr="tcp://h:1", threshold=512, region={"kind": "shm"},
        blocks=[7]))
    assert h == {"t": "gen", "rid": "3.1", "ids": [1, 2], "kind": "prefill", "iso": True, "dest": 2,
                 "dest_ident": W1, "addr": "tcp://h:1", "thr": 512, "region": {"kind": "shm"}, "blocks": [7],
                 "p": {"max_tokens": 4, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "ignore_eos": False,
                       "stop_token_ids": []}}
    assert encode(Heartbeat(worker_id=1, free=2, blocks=3, reserved=4, running=5, rejected=6, stray=7,
                            preempted=8)) == {"t": "hb", "id": 1, "free": 2, "blocks": 3, "reserved": 4,
                                              "running": 5, "rejected": 6, "stray": 7, "preempted": 8}
    assert encode(KvDone(rid="1.0", first_token=9, prefill_end=2.0, mode="serialized", sent_at=1.0,
                         inplace_bytes=64)) == {"t": "kvd", "rid": "1.0", "first": 9, "end": 2.0,
                                                "mode": "serialized", "sent": 1.0, "inplace": 64}
    assert encode(Ping()) == {"t": "ping"} and encode(Stop()) == {"t": "stop"}
    # every renamed attribute exists somewhere, and no two fields of a class share a wire name
    attrs = {f.name for cls in [*MESSAGES.values(), WireParams] for f in dataclasses.fields(cls)}
    assert set(WIRE_NAMES) <= attrs
    for cls in MESSAGES.values():
        names = [WIRE_NAMES.get(f.name, f.name) for f in dataclasses.fields(cls)]
        assert len(names) == len(set(names)) and "t" not in names and "_from" not in names


@pytest.mark.parametrize("msg", [
    Gen(rid="0.0", prompt_ids=list(range(100)), params=WireParams(
        max_tokens=16, temperature=0.7, top_p=0.9, top_k=50, ignore_eos=False, stop_token_ids=[2], seed=7,
        logit_bias=[(3, -1.5)]), kind="full"),
    Heartbeat(worker_id=1, free=90, blocks=100, reserved=1, running=3, rejected=0, stray=0, preempted=2),
    Out(items=[OutItem(f"{i}.0", [i], i % 2 == 0, "stop" if i % 2 == 0 else None) for i in range(32)]),
    KvDone(rid="4.0", first_token=17, prefill_end=1e9, mode="serialized", sent_at=1e9,
           meta={"num_layers": 2, "num_tokens": 8, "num_kv_heads": 2, "head_dim": 4, "dtype": "float32"}),
])
def test_round_trip_through_a_codec(msg):
    router, worker = Codec(SECRET, "router"), Codec(SECRET, W1)
    data = [b"\x01" * 256] if isinstance(msg, KvDone) else []
    if msg.T in TO_WORKER:
        header, got_data = worker.decode(router.encode(encode(msg), *data, to=W1), sender="router")
        assert decode(header, TO_WORKER) == msg and header["_from"] == "router"
    else:
        header, got_data = router.decode(worker.encode(encode(msg), *data, to="router"), sender=W1)
        assert decode(header, TO_ROUTER | KV) == msg and header["_from"] == W1
    assert [bytes(d) for d in got_data] == data


# ---- what today's code sends decodes ----------------------------------------------------------------
P = {"max_tokens": 16, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "ignore_eos": False, "stop_token_ids": []}
TODAY = [  # headers as router.py, worker.py and the KV transfer code built them by hand before messages/
    {"t": "expect", "rid": "1.0", "ids": [1, 2, 3], "p": P, "src": 0, "iso": False},
    {"t": "gen", "rid": "1.0", "ids": [1, 2, 3], "p": P, "kind": "full", "iso": False},
    {"t": "gen", "rid": "1.0", "ids": [1, 2, 3], "p": P, "kind": "prefill", "dest": 1, "dest_ident": W1,
     "addr": "tcp://127.0.0.1:5000", "thr": 512, "iso": True},
    {"t": "gen", "rid": "1.0", "ids": [1, 2, 3], "p": P, "kind": "prefill", "dest": 1, "dest_ident": W1,
     "addr": "tcp://127.0.0.1:5000", "thr": 512, "iso": False,
     "region": {"kind": "shm", "host": "h", "shape": [2, 2, 9, 16, 2, 4], "dtype": "float32", "name": "x",
                "cuda": None}, "blocks": [0, 1]},
    {"t": "cancel", "rid": "1.0"}, {"t": "abort", "rid": "1.0", "prefill_sent": False},
    {"t": "peer_down", "peer": 2}, {"t": "ping"}, {"t": "stop"},
    {"t": "hello", "id": 1, "pid": 1234, "kv": "tcp://127.0.0.1:5000", "blocks": 64, "block_size": 16, "free": 64,
     "max_len": 512, "region": None},
    {"t": "hb", "id": 1, "free": 60, "blocks": 64, "reserved": 1, "running": 2, "rejected": 0, "stray": 0,
     "preempted": 0},
    {"t": "out", "items": [["1.0", [5], False, "prefill"], ["2.0", [6, 7], True, "stop"], ["3.0", [], False, None]]},
    {"t": "reserved", "rid": "1.0", "ok": True, "blocks": [3, 4]},
    {"t": "reserved", "rid": "1.0", "ok": False, "msg": "does not fit"},
    {"t": "kv_in", "rid": "1.0", "first": 5, "bytes": 4096, "mode": "layerwise", "seconds": 0.01, "exposed": 0.0},
    {"t": "kv_fail", "rid": "1.0", "reason": "KV transfer timed out after 5 s"},
    {"t": "err", "rid": "1.0", "msg": "max_tokens must be at least 1"},
    {"t": "step_failed", "rids": ["1.0", "2.0"], "error": "RuntimeError('boom')"},
    {"t": "step", "chunks": [["1.0", 512], ["2.0", 7]], "preempted": ["3.0"], "joined": ["4.0"]},
    {"t": "step", "chunks": [["1.0", 48]], "preempted": ["6.0"], "joined": [],
     "sched": [[["2.0", "2.0"]], ["3.0"], [["2.0", 16]], [["3.0", 96, "3.0"], ["4.0", 32, "3.0"]], ["1.0"]]},  # ecoserve
    {"t": "out", "items": []},  # closes a step that produced no tokens
    {"t": "kvs", "rid": "1.0"},
    {"t": "kvl", "rid": "1.0", "layer": 0, "sent": 1.7e9},
    {"t": "kvl", "rid": "1.0", "layer": 3, "sent": 1.7e9, "inplace": 2048},
    {"t": "kvd", "rid": "1.0", "first": 5, "end": 1.7e9, "mode": "layerwise", "sent": 1.7e9},
    {"t": "kvd", "rid": "1.0", "first": 5, "end": 1.7e9, "mode": "serialized", "sent": 1.7e9,
     "meta": {"num_layers": 2, "num_tokens": 3, "num_kv_heads": 2, "head_dim": 4, "dtype": "bfloat16"}},
    {"t": "kvd", "rid": "1.0", "first": 5, "end": 1.7e9, "mode": "serialized", "sent": 1.7e9, "fail": "no region"},
    {"t": "kvx", "rid": "1.0"},
]


@pytest.mark.parametrize("header", TODAY, ids=[h["t"] for h in TODAY])
def test_todays_headers_decode(header):
    msg = decode(msgpack.unpackb(msgpack.packb(header)))
    # encoding it gives the same header again, less its nil fields
    assert msgpack.unpackb(msgpack.packb(encode(msg))) == {k: v for k, v in header.items() if v is not None}


def test_prepared_params_decode():
    from splitserve.serve.config import RequestLimits
    from splitserve.serve.openai_io import ModelInfo
    from splitserve.serve.schema import prepare

    info = ModelInfo.load("tiny")
    for body in ({"prompt": [1, 2, 3], "max_tokens": 4},
                 {"prompt": [1, 2], "max_tokens": 4, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 3,
                  "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2,
                  "logit_bias": {"7": 5, "3": -100}, "stop_token_ids": [2], "ignore_eos": True},
                 {"prompt": [1], "max_tokens": 1, "temperature": 1, "top_p": 1}):
        p = prepare(json.dumps(body).encode(), False, info, RequestLimits()).params  # a WireParams
        assert M.params_from_wire(msgpack.unpackb(msgpack.packb(p.to_wire()))) == p


# ---- malformed headers --------------------------------------------------------------------------------
EXAMPLES: dict[type, Message] = {
    Gen: Gen(rid="1.0", prompt_ids=[1, 2], params=WireParams(
        max_tokens=4, temperature=0.0, top_p=1.0, top_k=0, ignore_eos=False, stop_token_ids=[2], seed=1,
        presence_penalty=0.1, frequency_penalty=0.1, repetition_penalty=1.1, logit_bias=[(1, 1.0)], logprobs=2,
        prompt_logprobs=1), kind="prefill", isolated=True, predicted=7, dest=1, dest_ident=W1, dest_addr="tcp://h:1", threshold=512,
        region={"kind": "shm"}, blocks=[0], skip=16, resumed=1),
    Expect: Expect(rid="1.0", prompt_ids=[1], params=WireParams(
        max_tokens=4, temperature=0.0, top_p=1.0, top_k=0, ignore_eos=False, stop_token_ids=[]), src=0, isolated=True,
        resumed=1),
    Cancel: Cancel(rid="1.0"), Abort: Abort(rid="1.0", prefill_sent=True), PeerDown: PeerDown(peer=1),
    Ping: Ping(), Stop: Stop(),
    Hello: Hello(worker_id=0, pid=1, kv_addr="tcp://h:1", blocks=8, block_size=16, free=8, max_len=512,
                 region={"kind": "shm"}, boot="b"),
    Heartbeat: Heartbeat(worker_id=0, free=1, blocks=2, reserved=3, running=4, rejected=5, stray=6, preempted=7),
    Out: Out(items=[OutItem("1.0", [1], True, "stop")], lp={"1.0": [[[1, -0.5, 1, [[1, -0.5]]]], None]}),
    Reserved: Reserved(rid="1.0", ok=False, blocks=[1], msg="no", skip=32, full=True),
    KvIn: KvIn(rid="1.0", first_token=1, nbytes=2, mode="layerwise", seconds=0.1, exposed=0.2,
               lp=[[[1, -0.5, 1, []]], [[2, -1.5, 3, []]]], skipped=48),
    KvFail: KvFail(rid="1.0", reason="x"), Err: Err(rid="1.0", msg="x"),
    StepFailed: StepFailed(rids=["1.0"], error="x"),
    Step: Step(chunks=[StepChunk("1.0", 5)], preempted=["2.0"], joined=["3.0"],
               sched=[[["4.0", "5.0"]], ["6.0"], [["5.0", 16]], [["6.0", 32, "6.0"]], ["1.0"]], at=1.5, cached=[StepChunk("1.0", 16)],
               grown=["3.0"]),
    KvStart: KvStart(rid="1.0"), KvLayer: KvLayer(rid="1.0", layer=0, sent_at=1.0, inplace_bytes=5),
    KvDone: KvDone(rid="1.0", first_token=1, prefill_end=1.0, mode="serialized", sent_at=1.0,
                   meta={"num_layers": 1, "num_tokens": 1, "num_kv_heads": 1, "head_dim": 1, "dtype": "float32"},
                   inplace_bytes=4, fail="x", lp=[None, [[2, -1.5, 3, [[4, -0.1]]]]]),
    KvDrop: KvDrop(rid="1.0"),
}
FULL = {cls: wire(m) for cls, m in EXAMPLES.items()}  # every field present
FIELDS = [(cls.T, k) for cls, h in FULL.items() for k in h if k != "t"]
REQUIRED = [(cls.T, WIRE_NAMES.get(f.name, f.name)) for cls in MESSAGES.values() for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def header_of(t: str) -> dict:
    return dict(FULL[MESSAGES[t]])


def test_examples_hold_every_field():
    for cls, h in FULL.items():
        assert len(h) - 1 == len(dataclasses.fields(cls)) and decode(h) == EXAMPLES[cls]


@pytest.mark.parametrize("t,name", REQUIRED)
def test_missing_field(t, name):
    h = header_of(t)
    del h[name]
    e = refused(h)
    assert (e.kind, e.field) == (t, name) and e.reason.startswith(f"{t}: field {name!r}: missing")


def valid_for(bad, t: str, name: str) -> bool:
    """Whether `bad` is a valid value of field `name` of kind `t` (the example's value types it)."""
    example = header_of(t)[name]
    if type(bad) is str:
        return type(example) is str and name not in ("kind", "mode")
    if type(bad) in (float, bool):
        return type(example) is type(bad)
    if type(bad) is dict:
        return name == "region"
    if type(bad) is list:
        return name == "sched"   # a machine scheduler's own report: any list (its scheduler reads it)
    return False  # bytes, a list of lists, -1: valid nowhere else


@pytest.mark.parametrize("t,name", FIELDS)
@pytest.mark.parametrize("bad", [b"x", [["nested"]], {"a": 1}, 1.5, "s", -1, True],
                         ids=["bytes", "list", "map", "float", "str", "negative", "bool"])
def test_wrong_type(t, name, bad):
    if valid_for(bad, t, name):
        assert decode({**header_of(t), name: bad})
        return
    h = {**header_of(t), name: bad}
    e = refused(h)
    assert e.kind == t and (e.field == name or e.field.startswith(name + ".")), e.reason
    assert e.reason.startswith(f"{t}: field {e.field!r}: ")
    assert e.rid == (h["rid"] if type(h.get("rid")) is str else None)


@pytest.mark.parametrize("t", sorted(MESSAGES))
def test_unknown_field(t):
    e = refused({**header_of(t), "bogus": 1})
    assert (e.kind, e.field) == (t, "bogus") and e.reason == f"{t}: field 'bogus': unknown field"
    e = refused({**header_of(t), "_to": "router"})  # envelope keys other than _from are no fields
    assert e.field == "_to"


@pytest.mark.parametrize("t", [5, None, "nope", "Gen", ["gen"]])
def test_unknown_type(t):
    e = refused({"t": t, "rid": "1.0"})
    assert e.reason == f"unknown type {t!r}" and e.field == "t"
    e = refused({"rid": "1.0"})
    assert e.reason == "unknown type None"


def test_not_a_map():
    assert "must be a map" in refused([("t", "ping")]).reason


def test_kinds_filter():
    assert decode({"t": "ping"}, TO_WORKER) == Ping()
    e = refused(header_of("hello"), TO_WORKER)
    assert e.reason == "hello: unexpected type 'hello' here" and e.kind == "hello"
    e = refused(header_of("gen"), KV)
    assert e.rid == "1.0"
    refused(header_of("kvl"), TO_ROUTER)


MALFORMED = [  # (header changes, field named, words in the reason)
    ("hb", {"free": True}, "free", "non-negative int, got bool"),
    ("hb", {"free": -1}, "free", "non-negative int, got -1"),
    ("hb", {"free": 1.0}, "free", "got float"),
    ("peer_down", {"peer": -2}, "peer", "non-negative"),
    ("hello", {"block_size": 0}, "block_size", ">= 1"),
    ("hello", {"max_len": 0}, "max_len", ">= 1"),
    ("hello", {"region": {1: 2}}, "region", "string keys"),
    ("gen", {"ids": [1, -1]}, "ids", "with item -1"),
    ("gen", {"ids": [1, True]}, "ids", "with item True"),
    ("gen", {"ids": [1, 2.0]}, "ids", "with item 2.0"),
    ("gen", {"ids": [2**64]}, "ids", "with item"),
    ("gen", {"blocks": [-5]}, "blocks", "with item -5"),
    ("gen", {"kind": "half"}, "kind", "'full' or 'prefill'"),
    ("gen", {"kind": None}, "kind", "got NoneType"),
    ("gen", {"thr": -1}, "thr", "non-negative"),
    ("gen", {"iso": 1}, "iso", "bool"),
    ("gen", {"p": [1]}, "p", "expected a map"),
    ("gen", {"p": {"max_tokens": 1}}, "p.temperature", "missing"),
    ("expect", {"p": {**P, "max_tokens": 0}}, "p.max_tokens", ">= 1"),
    ("expect", {"p": {**P, "max_tokens": True}}, "p.max_tokens", "got bool"),
    ("expect", {"p": {**P, "temperature": -0.5}}, "p.temperature", ">= 0"),
    ("expect", {"p": {**P, "temperature": float("nan")}}, "p.temperature", "finite"),
    ("expect", {"p": {**P, "top_p": float("inf")}}, "p.top_p", "finite"),
    ("expect", {"p": {**P, "top_k": -2}}, "p.top_k", ">= -1"),
    ("expect", {"p": {**P, "seed": 1.5}}, "p.seed", "an int"),
    ("expect", {"p": {**P, "stop_token_ids": [-1]}}, "p.stop_token_ids", "with item -1"),
    ("expect", {"p": {**P, "logit_bias": [[1, "x"]]}}, "p.logit_bias", "item 0"),
    ("expect", {"p": {**P, "logit_bias": [[-1, 1.0]]}}, "p.logit_bias", "item 0"),
    ("expect", {"p": {**P, "logit_bias": [[1, 1.0, 2]]}}, "p.logit_bias", "item 0"),
    ("expect", {"p": {**P, "repetition_penalty": None}}, "p.repetition_penalty", "NoneType"),
    ("expect", {"p": {**P, "typo": 1}}, "p.typo", "unknown field"),
    ("expect", {"src": None}, "src", "NoneType"),
    ("out", {"items": [["1.0", [1], True]]}, "items", "item 0"),
    ("out", {"items": [["1.0", [1], True, None], ["2.0", [1], 1, None]]}, "items", "item 1"),
    ("out", {"items": [["1.0", [1, False], True, None]]}, "items", "item 0: tokens"),
    ("out", {"items": [["1.0", [-3], True, None]]}, "items", "with item -3"),
    ("out", {"items": [[1, [1], True, None]]}, "items", "item 0"),
    ("out", {"items": [["1.0", [1], True, 5]]}, "items", "item 0"),
    ("out", {"items": ["1.0"]}, "items", "item 0"),
    ("step", {"chunks": [["1.0", -1]]}, "chunks", "item 0"),
    ("step", {"chunks": [["1.0"]]}, "chunks", "item 0"),
    ("step", {"preempted": ["1.0", 2]}, "preempted", "with item 2"),
    ("step", {"joined": "1.0"}, "joined", "expected a list of strings"),
    ("step", {"sched": {"parked": ["1.0"]}}, "sched", "expected a list"),
    ("step_failed", {"rids": [None]}, "rids", "with item None"),
    ("kv_in", {"mode": "tcp"}, "mode", "'layerwise' or 'serialized'"),
    ("kv_in", {"seconds": -0.1}, "seconds", ">= 0"),
    ("kv_in", {"exposed": float("inf")}, "exposed", "finite"),
    ("kvl", {"inplace": -1}, "inplace", "non-negative"),
    ("kvd", {"meta": {"num_layers": 1}}, "meta", "expected the keys"),
    ("kvd", {"meta": {"num_layers": -1, "num_tokens": 1, "num_kv_heads": 1, "head_dim": 1, "dtype": "x"}},
     "meta", "key 'num_layers'"),
    ("kvd", {"end": float("nan")}, "end", "finite"),
    ("reserved", {"ok": "yes"}, "ok", "bool"),
]


@pytest.mark.parametrize("t,change,name,words", MALFORMED)
def test_malformed(t, change, name, words):
    e = refused({**header_of(t), **change})
    assert (e.kind, e.field) == (t, name), e.reason
    assert e.reason.startswith(f"{t}: field {name!r}: ") and words in e.reason, e.reason


def test_gen_fields_by_kind():
    full = {k: v for k, v in header_of("gen").items() if k not in ("dest", "dest_ident", "addr", "thr", "region",
                                                                    "blocks", "skip")}
    assert decode({**full, "kind": "full"}).kind == "full"
    for k in ("dest", "dest_ident", "addr", "thr"):
        e = refused({**header_of("gen"), k: None})
        assert e.field == k and "missing (kind 'prefill')" in e.reason
        e = refused({**full, "kind": "prefill"})
        assert e.field == "dest"
    for k in ("dest", "dest_ident", "addr", "thr", "region", "blocks", "skip"):
        e = refused({**full, "kind": "full", k: header_of("gen")[k]})
        assert e.field == k and e.reason == f"gen: field {k!r}: only for kind 'prefill'"
    assert decode({**full, "kind": "full", "region": None}).region is None  # nil: absent


def test_params_from_wire_errors():
    with pytest.raises(MalformedMessage) as e:
        M.params_from_wire({**P, "top_k": "x"})
    assert e.value.reason.startswith("p: field 'top_k': ") and e.value.field == "top_k"
    with pytest.raises(MalformedMessage):
        M.params_from_wire([])


# what msgpack can carry: integers in [-2**63, 2**64)
junk = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=4)
                    | st.binary(max_size=4), lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4),
                                                                                              c, max_size=4),
                    max_leaves=10)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(sorted(MESSAGES)), st.data())
def test_fuzz_only_malformed_message(t, data):
    """Any header: a message or MalformedMessage, never another exception."""
    h = header_of(t)
    for k in data.draw(st.lists(st.sampled_from(sorted(h)), max_size=3, unique=True)):
        if data.draw(st.booleans()):
            del h[k]
        else:
            h[k] = data.draw(junk)
    if data.draw(st.booleans()):
        h[data.draw(st.text(max_size=4))] = data.draw(junk)
    try:
        msg = decode(h)
    except MalformedMessage as e:
        assert e.reason.startswith(f"{t}: ") or e.reason.startswith("unknown type")
    else:
        assert isinstance(msg, MESSAGES[t]) and decode(wire(msg)) == msg


# ---- the stage, and the message table of docs/architecture.md ------------------------------------------------------------
def test_stage():
    assert [s.value for s in Stage] == ["new", "parked", "waiting", "reserving", "prefill", "handoff", "decode",
                                        "done"]
    assert str(Stage.DECODE) == "decode" and f"{Stage.PARKED}" == "parked" and Stage("handoff") is Stage.HANDOFF
    assert Stage.DONE == "done"
    docs = [s.__doc__ for s in Stage]
    assert all(d and d != Stage.__doc__ and "\n" not in d for d in docs) and len(set(docs)) == len(docs)


def test_the_architecture_page_lists_every_message():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith(("| router -> ", "| worker -> "))]
    assert len(rows) == len(MESSAGES)
    direction = {**{t: "router -> worker" for t in TO_WORKER}, **{t: "worker -> router" for t in TO_ROUTER},
                 **{t: "worker -> worker" for t in KV}}
    for t, cls in MESSAGES.items():
        row = next(r for r in rows if f"| `{t}` ({cls.__name__}) |" in r)
        assert row.startswith(f"| {direction[t]} |")
        fields_cell = row.split(" | ")[2]
        for f in dataclasses.fields(cls):
            w = WIRE_NAMES.get(f.name, f.name)
            assert f"{w}:" in fields_cell or f"{w}?:" in fields_cell, (t, w)
            if w != f.name:
                assert f"= {f.name}" in fields_cell, (t, f.name)


def test_floats_are_finite_after_decode():
    got = decode(wire(EXAMPLES[KvIn]))
    assert math.isfinite(got.seconds) and math.isfinite(got.exposed)
