"""The OpenAI-compatible API: shapes, streaming, chat, auth, bad input, internal-channel secret."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import zmq

from splitserve.serve.openai_io import default_chat_text

from .conftest import API_KEY, reference


def post(srv, path, body=None, headers=None, raw=None):
    h = srv.headers if headers is None else headers
    if raw is not None:
        return httpx.post(srv.url + path, content=raw, headers={**h, "Content-Type": "application/json"}, timeout=30)
    return httpx.post(srv.url + path, json=body, headers=h, timeout=30)


def sse(srv, path, body):
    events = []
    with httpx.stream("POST", srv.url + path, json=body, headers=srv.headers, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    return events


def test_models_health_metrics(split_server):
    r = httpx.get(split_server.url + "/v1/models", headers=split_server.headers)
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["tiny"]
    h = httpx.get(split_server.url + "/health").json()
    assert h["status"] == "ok" and h["workers_up"] == 2
    text = httpx.get(split_server.url + "/metrics").text
    for name in ("splitserve_ttft_seconds_bucket", "splitserve_tbt_seconds_bucket", "splitserve_e2e_seconds_bucket",
                 'splitserve_queue_requests{pool="prompt"}', 'splitserve_kv_blocks_in_use{worker="1"}',
                 'splitserve_kv_transfer_bytes_total{mode="layerwise"}',
                 'splitserve_kv_transfer_exposed_seconds_total{mode="layerwise"}'):
        assert name in text, name


def test_text_prompt_non_streaming_and_streaming_agree(split_server, reference_engine):
    body = {"model": "tiny", "prompt": "Hello, world", "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    r = post(split_server, "/v1/completions", body)
    assert r.status_code == 200
    js = r.json()
    ids = reference_engine.tokenizer.encode("Hello, world")
    want = reference(reference_engine, [ids], [10], ignore_eos=True)[0]
    assert js["object"] == "text_completion"
    assert js["choices"][0]["token_ids"] == want
    assert js["choices"][0]["text"] == reference_engine.tokenizer.decode(want)
    assert js["choices"][0]["finish_reason"] == "length"
    assert js["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 10, "total_tokens": len(ids) + 10,
                           "prompt_tokens_details": {"cached_tokens": 0}}

    events = sse(split_server, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    toks = [t for c in chunks for ch in c["choices"] for t in ch["token_ids"]]
    assert toks == want
    assert "".join(ch["text"] for c in chunks for ch in c["choices"]) == js["choices"][0]["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10


def test_stop_string_cuts_text(split_server, reference_engine):
    ids = [1, 72, 105]
    want = reference(reference_engine, [ids], [20], ignore_eos=True)[0]
    text = reference_engine.tokenizer.decode(want)
    stop = text[3:5]
    r = post(split_server, "/v1/completions", {"prompt": ids, "max_tokens": 20, "temperature": 0,
                                               "ignore_eos": True, "stop": stop})
    js = r.json()
    assert js["choices"][0]["finish_reason"] == "stop"
    assert js["choices"][0]["text"] == text[: text.find(stop)]


def test_chat_default_template(split_server, reference_engine):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    ids = reference_engine.tokenizer.encode(default_chat_text(msgs))
    want = reference(reference_engine, [ids], [6], ignore_eos=True)[0]
    r = post(split_server, "/v1/chat/completions", {"model": "tiny", "messages": msgs, "max_tokens": 6,
                                                    "temperature": 0, "ignore_eos": True})
    js = r.json()
    assert js["object"] == "chat.completion"
    assert js["choices"][0]["message"] == {"role": "assistant", "content": reference_engine.tokenizer.decode(want)}
    assert js["usage"]["prompt_tokens"] == len(ids)
    events = sse(split_server, "/v1/chat/completions", {"messages": msgs, "max_tokens": 6, "temperature": 0,
                                                        "ignore_eos": True, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == js["choices"][0]["message"]["content"]


BAD = [
    ("malformed json", None, b'{"prompt": [1, 2', 400, "invalid_json"),
    ("not an object", None, b"[1, 2, 3]", 400, "invalid_json"),
    ("missing prompt", {"max_tokens": 3}, None, 400, "missing_field"),
    ("prompt wrong type", {"prompt": 42}, None, 400, "invalid_type"),
    ("prompt ids wrong type", {"prompt": [1, "a"]}, None, 400, "invalid_type"),
    ("token outside vocab", {"prompt": [1, 100000]}, None, 400, "invalid_value"),
    ("empty prompt", {"prompt": []}, None, 400, "invalid_value"),
    ("prompt longer than context", {"prompt": [5] * 600}, None, 400, "context_length_exceeded"),
    ("max_tokens zero", {"prompt": [1, 2], "max_tokens": 0}, None, 400, "invalid_value"),
    ("max_tokens negative", {"prompt": [1, 2], "max_tokens": -3}, None, 400, "invalid_value"),
    ("max_tokens above limit", {"prompt": [1, 2], "max_tokens": 100000}, None, 400, "context_length_exceeded"),
    ("max_tokens wrong type", {"prompt": [1, 2], "max_tokens": "ten"}, None, 400, "invalid_type"),
    ("max_tokens bool", {"prompt": [1, 2], "max_tokens": True}, None, 400, "invalid_type"),
    ("temperature wrong type", {"prompt": [1, 2], "temperature": "hot"}, None, 400, "invalid_type"),
    ("temperature out of range", {"prompt": [1, 2], "temperature": -1}, None, 400, "invalid_value"),
    ("stream wrong type", {"prompt": [1, 2], "stream": "yes"}, None, 400, "invalid_type"),
    ("n > 16", {"prompt": [1, 2], "n": 17}, None, 400, "invalid_value"),
    ("unknown model", {"model": "gpt-17", "prompt": [1, 2]}, None, 404, "model_not_found"),
]


@pytest.mark.parametrize("name,body,raw,status,code", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_openai_error(split_server, name, body, raw, status, code):
    r = post(split_server, "/v1/completions", body, raw=raw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code and err["message"]
    assert err["type"] in ("invalid_request_error", "not_found_error")


def test_bad_chat_input(split_server):
    for body in ({"messages": []}, {"messages": "hi"}, {"messages": [{"content": "no role"}]},
                 {"messages": [{"role": "user", "content": 5}]}):
        r = post(split_server, "/v1/chat/completions", body)
        assert r.status_code == 400, body
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_api_key_required(split_server):
    body = {"prompt": [1, 2], "max_tokens": 2}
    for headers, what in (({}, "missing"), ({"Authorization": "Bearer wrong"}, "wrong"),
                          ({"Authorization": API_KEY}, "no scheme")):
        r = post(split_server, "/v1/completions", body, headers=headers)
        assert r.status_code == 401, what
        assert r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(split_server.url + "/v1/models").status_code == 401
    assert post(split_server, "/v1/completions", body).status_code == 200


def test_unknown_route_is_openai_error(split_server):
    r = httpx.get(split_server.url + "/v1/nothing", headers=split_server.headers)
    assert r.status_code == 404
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_internal_channels_reject_peers_without_the_secret(split_server):
    from splitserve.serve.protocol import Codec

    st = split_server.state()
    assert st["rejected_messages"] == 0
    forged = Codec(b"not-the-cluster-secret-at-all!!!", "router")
    ctx = zmq.Context()
    try:
        # pose as worker 1 to the router: with the identity scheme of old (w<id>.<generation>) and
        # with the right name but the wrong secret: a fake hello and garbage, all dropped
        for ident in (b"w1.1", b"w1.2"):
            router = ctx.socket(zmq.DEALER)
            router.setsockopt(zmq.IDENTITY, ident)
            router.setsockopt(zmq.LINGER, 0)
            router.connect(st["router_address"])
            router.send_multipart(forged.encode({"t": "hello", "id": 1, "pid": 1, "kv": "tcp://1.2.3.4:1",
                                                 "blocks": 1, "block_size": 1, "free": 1, "max_len": 1},
                                                to="router"))
            router.send_multipart([b"\0" * 16, b"garbage"])
        # inject KV into the token worker
        kv = ctx.socket(zmq.DEALER)
        kv.setsockopt(zmq.LINGER, 0)
        kv.connect(st["workers"][1]["kv_addr"])
        kv.send_multipart(forged.encode({"t": "kvd", "rid": "0.0", "first": 5, "end": 0, "sent": 0,
                                         "mode": "serialized"}, to="w1.1"))
        deadline = time.monotonic() + 5
        while True:
            st = split_server.state()
            if (st["rejected_messages"] >= 2 and st["workers"][1]["rejected_messages"] >= 1) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        ctx.destroy(linger=0)
    assert st["rejected_messages"] >= 2
    assert st["workers"][1]["rejected_messages"] >= 1
    assert st["workers"][1]["kv_addr"] != "tcp://1.2.3.4:1"  # the forged hello changed nothing
    assert split_server.metric("splitserve_rejected_internal_messages", where="router") >= 2
    r = post(split_server, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200  # and the cluster still serves
