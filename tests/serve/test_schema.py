"""Request checks (schema.prepare), without a server: every field by type and range, the size
limits that are checked before any work that grows with the input, and what reaches the workers."""

from __future__ import annotations

import json
import time

import pytest

from splitserve.serve.config import RequestLimits
from splitserve.serve.openai_io import ApiError, ModelInfo
from splitserve.serve.schema import prepare

INFO = ModelInfo.load("tiny")   # 259 tokens, context 512, longest vocabulary entry 7 characters
LIMITS = RequestLimits()


def ok(body: dict, chat: bool = False):
    return prepare(json.dumps(body).encode(), chat, INFO, LIMITS)


def err(body, chat: bool = False, raw: bytes | None = None) -> ApiError:
    with pytest.raises(ApiError) as e:
        prepare(raw if raw is not None else json.dumps(body).encode(), chat, INFO, LIMITS)
    b = e.value.body()["error"]
    assert set(b) == {"message", "type", "param", "code"} and b["message"]
    return e.value


@pytest.mark.parametrize("field,value,code", [
    ("top_k", -2, "invalid_value"), ("top_k", 1.5, "invalid_type"), ("top_k", "5", "invalid_type"),
    ("temperature", 2.5, "invalid_value"), ("temperature", True, "invalid_type"),
    ("top_p", 0, "invalid_value"), ("top_p", 1.01, "invalid_value"),
    ("seed", 2 ** 63, "invalid_value"), ("seed", -(2 ** 63) - 1, "invalid_type"),  # orjson reads it as a float
    ("presence_penalty", 2.1, "invalid_value"), ("frequency_penalty", -2.1, "invalid_value"),
    ("repetition_penalty", 0, "invalid_value"), ("repetition_penalty", 2.5, "invalid_value"),
    ("max_tokens", 0, "invalid_value"), ("max_tokens", 10 ** 6, "context_length_exceeded"),
    ("max_tokens", 10 ** 30, "invalid_type"),  # beyond 64 bits orjson reads a float
    ("stop_token_ids", [1, 259], "invalid_value"), ("stop_token_ids", [1, 2 ** 70], "invalid_type"),
    ("stop_token_ids", "2", "invalid_type"), ("logit_bias", {"5": 101}, "invalid_value"),
    ("logit_bias", {"999": 1}, "invalid_value"), ("logit_bias", {"x": 1}, "invalid_type"),
    ("stream", "yes", "invalid_type"), ("stream_options", {"include_usage": 1}, "invalid_type"),
    ("n", 17, "invalid_value"), ("best_of", 0, "invalid_value"), ("logprobs", 21, "invalid_value"),
    ("suffix", "tail", "unsupported"), ("min_tokens", -1, "invalid_value"), ("min_tokens", 17, "invalid_value"),
    ("min_p", 1.5, "invalid_value"), ("min_p", "0.1", "invalid_type"), ("guided_regex", "(", "invalid_value"),
    ("guided_choice", [], "invalid_value"), ("guided_choice", ["a", ""], "invalid_value"),
    ("guided_grammar", "start: (", "invalid_value"), ("guided_json", "{not json", "invalid_value"),
    ("guided_json", "[1]", "invalid_value"), ("include_stop_str_in_output", 1, "invalid_type"),
])
def test_each_field_is_checked_by_type_and_range(field, value, code):
    e = err({"prompt": [1, 2, 3], field: value})
    assert e.status == 400 and e.code == code and e.param == field


def test_what_reaches_the_workers_is_in_range():
    g = ok({"prompt": "hi", "max_tokens": 5, "top_k": 2 ** 63, "temperature": 1e-300, "seed": 2 ** 63 - 1,
            "logit_bias": {"7": -100, "3": 2.5}, "repetition_penalty": 1.2, "stop_token_ids": [2]})
    assert g.prompt_ids == [1, 107, 108]
    p = g.params.to_wire()                      # what the workers get
    assert p["top_k"] == 0                      # beyond the vocabulary: off, not an overflow
    assert p["temperature"] == 1e-300 and p["seed"] == 2 ** 63 - 1
    assert p["logit_bias"] == [(3, 2.5), (7, -100.0)] and p["repetition_penalty"] == 1.2
    assert "presence_penalty" not in p          # defaults are not sent
    assert ok({"prompt": [1], "top_k": -1}).params.top_k == 0
    assert ok({"prompt": [1], "top_k": 40}).params.top_k == 40


def test_defaults_and_max_tokens():
    g = ok({"prompt": [1, 2, 3]})
    assert g.params.max_tokens == 16 and not g.stream and g.stop == [] and g.echo_text is None
    chat = ok({"messages": [{"role": "user", "content": "hi"}]}, chat=True)
    assert chat.params.max_tokens == 512 - len(chat.prompt_ids)  # chat: all that fits
    assert ok({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9, "max_completion_tokens": 3},
              chat=True).params.max_tokens == 3
    assert err({"prompt": [1] * 500, "max_tokens": 13}).code == "context_length_exceeded"


def test_echo_gives_the_prompt_text():
    assert ok({"prompt": "Hello", "echo": True}).echo_text == "Hello"
    assert ok({"prompt": [1, 75, 108], "echo": True}).echo_text == "Hi"   # ids: decoded
    assert err({"messages": [{"role": "user", "content": "x"}], "echo": True}, chat=True).code == "unsupported"


def test_malformed_bodies_are_400_not_500():
    assert err(None, raw=b'{"prompt": "a\\ud800"}').param == "prompt"           # a lone surrogate
    assert err(None, raw=b'{"prompt": [1], "stop": ["\\udc00"]}').param == "stop"
    assert err(None, raw=b'{"messages": [{"role": "user", "content": "\\ud83d"}]}', chat=True).param == "messages"
    assert err(None, raw=b'{"a":' * 100_000 + b"1" + b"}" * 100_000).code == "invalid_json"  # deep nesting
    assert err(None, raw=b"[" * 5000 + b"]" * 5000).code == "invalid_json"
    assert err(None, raw=b'{"prompt": [1], "temperature": NaN}').code == "invalid_value"
    assert err(None, raw=b"\xff\xfe").code == "invalid_json"


def test_stop_strings_are_bounded():
    assert len(ok({"prompt": [1], "stop": ["a"] * 16}).stop) == 16
    assert err({"prompt": [1], "stop": ["a"] * 17}).param == "stop"
    assert err({"prompt": [1], "stop": "x" * 257}).param == "stop"
    assert err({"prompt": [1], "stop": ["b"] * 200_000}).param == "stop"


def test_a_huge_text_prompt_is_refused_before_it_is_tokenized():
    info = ModelInfo.load("tiny")
    assert info.max_prompt_chars == 512 * 7
    raw = json.dumps({"prompt": "x" * (16 << 20)}).encode()        # 16 MB of text
    t = time.perf_counter()
    with pytest.raises(ApiError) as e:
        prepare(raw, False, info, RequestLimits(max_body_bytes=32 << 20))
    took = time.perf_counter() - t
    assert e.value.code == "context_length_exceeded" and "characters" in e.value.message
    t = time.perf_counter()
    info.tokenizer.encode("x" * (1 << 20))                          # tokenizing even 1 MB of it
    tokenize_1mb = time.perf_counter() - t
    assert took < tokenize_1mb, (took, tokenize_1mb)               # it was never tokenized
    # a text that fits the character bound is tokenized and then checked in tokens
    assert err({"prompt": "y" * 600}).code == "context_length_exceeded"


def test_token_id_prompts_are_checked_before_they_are_scanned():
    assert err({"prompt": [5] * 600}).code == "context_length_exceeded"
    assert err({"prompt": [1, "a"]}).code == "invalid_type"
    assert err({"prompt": [1, True]}).code == "invalid_type"
    assert err({"prompt": [1, 259]}).code == "invalid_value"


def test_object_schemas_that_list_their_properties_are_closed():
    from splitserve.serve.schema import closed

    s = {"type": "object", "properties": {"properties": {"type": "object", "properties": {
        "x": {"enum": [{"properties": {}}]}}}, "b": {"type": "array", "items": {"properties": {"c": {}}}}},
        "$defs": {"D": {"properties": {}}}, "anyOf": [{"properties": {"z": {}}, "additionalProperties": True}]}
    got = closed(s)
    assert got["additionalProperties"] is False and got["properties"]["properties"]["additionalProperties"] is False
    assert got["properties"]["b"]["items"]["additionalProperties"] is False
    assert got["$defs"]["D"]["additionalProperties"] is False and got["anyOf"][0]["additionalProperties"] is True
    assert got["properties"]["properties"]["properties"]["x"] == {"enum": [{"properties": {}}]}  # values untouched
    assert "additionalProperties" not in closed({"type": "object"})             # json_object: any object
