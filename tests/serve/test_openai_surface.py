"""The OpenAI surface a vLLM user expects (issue 17, item 2): `GET /v1/models/{id}`, vLLM's
`/tokenize` and `/detokenize`, `/version`, `/openapi.json` and `/docs`, and a 400 naming every
field of the OpenAI API or of vLLM's extensions that splitserve accepts but does not implement.

The request checks first, without a server (schema.py, bodies.py, refusals.py); then the official
`openai` client, and plain httpx for the routes it has no method for, against a real
`serve --model tiny`."""

from __future__ import annotations

import importlib.metadata
import dataclasses
import json

import httpx
import pytest

from splitserve.serve.bodies import ChatCompletionRequest, CompletionRequest
from splitserve.serve.config import RequestLimits
from splitserve.serve.openai_io import ApiError, ModelInfo, default_chat_text
from splitserve.serve.refusals import UNSUPPORTED
from splitserve.serve.schema import detokenize, prepare, tokenize

from .conftest import API_KEY

INFO = ModelInfo.load("tiny")   # byte b is token 3 + b; BOS is 1, EOS 2; context 512
LIMITS = RequestLimits()

# one value per refused field that asks for something (a realistic one where the field has a shape)
ASKING = {
    "suffix": "tail",
    "functions": [{"name": "f"}], "function_call": "auto",
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"], "prediction": {"type": "content", "content": "x"},
    "verbosity": "low", "web_search_options": {}, "moderation": {"model": "m"},
    "prompt_cache_retention": "24h", "prompt_cache_options": {"k": 1},
    "use_beam_search": True, "length_penalty": 0.5,
    "guided_decoding_backend": "xgrammar", "guided_whitespace_pattern": " ", "structured_outputs": {"regex": "a"},
    "structural_tag": "{}", "spaces_between_special_tokens": False, "allowed_token_ids": [5], "bad_words": ["x"],
    "truncate_prompt_tokens": 5, "prompt_embeds": "AAAA", "priority": 1, "request_id": "r1",
    "logits_processors": ["m.P"], "return_tokens_as_token_ids": True, "return_token_ids": True,
    "cache_salt": "s", "kv_transfer_params": {"do_remote_decode": True}, "vllm_xargs": {"a": 1},
    "max_repetition_pattern_size": 3, "min_repetition_pattern_size": 1, "repetition_min_count": 2,
    "include_reasoning": False, "continue_final_message": True, "documents": [{"title": "t", "text": "x"}],
    "chat_template": "{{ messages }}", "chat_template_kwargs": {"enable_thinking": True},
    "mm_processor_kwargs": {"a": 1}, "media_io_kwargs": {"image": {}},
}

# vLLM's request fields (vllm/entrypoints/openai/completion/protocol.py, chat_completion/protocol.py
# and serve/tokenize/protocol.py), beyond the OpenAI API's
VLLM_FIELDS = {
    "use_beam_search", "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids",
    "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens",
    "truncate_prompt_tokens", "allowed_token_ids", "prompt_logprobs", "bad_words", "prompt_embeds",
    "add_special_tokens", "response_format", "structured_outputs", "priority", "request_id", "logits_processors",
    "return_tokens_as_token_ids", "return_token_ids", "cache_salt", "kv_transfer_params", "vllm_xargs",
    "max_repetition_pattern_size", "min_repetition_pattern_size", "repetition_min_count", "include_reasoning",
    "echo", "add_generation_prompt", "continue_final_message", "documents", "chat_template", "chat_template_kwargs",
    "mm_processor_kwargs", "media_io_kwargs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "guided_decoding_backend", "guided_whitespace_pattern", "structural_tag",
}


def err(body: dict, chat: bool = False) -> ApiError:
    with pytest.raises(ApiError) as e:
        prepare(json.dumps(body).encode(), chat, INFO, LIMITS)
    return e.value


# ---- without a server --------------------------------------------------------------------------------------
def test_the_asking_values_cover_the_refused_fields():
    assert set(ASKING) == set(UNSUPPORTED)


def test_every_field_of_the_openai_client_and_of_vllm_is_implemented_or_refused():
    openai = pytest.importorskip("openai")
    from openai.types import completion_create_params as cp
    from openai.types.chat import completion_create_params as ccp

    for params, model in ((cp.CompletionCreateParamsBase, CompletionRequest),
                          (ccp.CompletionCreateParamsBase, ChatCompletionRequest)):
        fields = set(params.__annotations__)
        assert "suffix" in fields or "tools" in fields, openai.__version__
        left = {f for f in fields if f not in model.model_fields and f not in UNSUPPORTED}
        assert not left, f"fields of the openai client ({openai.__version__}) neither implemented nor refused: {left}"
    left = {f for f in VLLM_FIELDS - {"echo"}
            if f not in CompletionRequest.model_fields and f not in ChatCompletionRequest.model_fields
            and f not in UNSUPPORTED}
    assert not left, left


@pytest.mark.parametrize("field", sorted(UNSUPPORTED))
@pytest.mark.parametrize("chat", [False, True])
def test_each_unimplemented_field_is_refused_by_name_and_its_default_is_accepted(field, chat):
    body = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": [1, 2]}
    e = err({**body, field: ASKING[field]}, chat)
    assert (e.status, e.param, e.code) == (400, field, "unsupported") and f"'{field}'" in e.message
    for quiet in UNSUPPORTED[field]:  # the values that ask for nothing pass
        prepare(json.dumps({**body, field: quiet}).encode(), chat, INFO, LIMITS)


def test_message_keys_and_stream_options_that_are_not_implemented_are_refused():
    msg = {"role": "user", "content": "hi"}
    for key, value in (("function_call", {"name": "f"}), ("refusal", "no"),
                       ("audio", {"id": "a"})):
        e = err({"messages": [msg, {**msg, key: value}]}, chat=True)
        assert (e.param, e.code) == (f"messages.{key}", "unsupported") and f"messages[1].{key}" in e.message
    e = err({"prompt": [1], "stream": True, "stream_options": {"include_usage": True, "include_obfuscation": True}})
    assert (e.param, e.code) == ("stream_options.include_obfuscation", "unsupported")
    for so, usage, continuous in (({"include_usage": True, "include_obfuscation": False}, True, False),
                                  ({"include_usage": True, "continuous_usage_stats": True}, True, True),
                                  ({"continuous_usage_stats": True}, False, False)):   # vLLM: needs include_usage
        g = prepare(json.dumps({"prompt": [1], "stream": True, "stream_options": so}).encode(), False, INFO, LIMITS)
        assert (g.include_usage, g.continuous_usage) == (usage, continuous)


def test_add_special_tokens_and_add_generation_prompt_are_implemented():
    # "Hi": H = 72 -> 75, i = 105 -> 108; BOS 1 only with add_special_tokens (the default)
    assert prepare(b'{"prompt": "Hi"}', False, INFO, LIMITS).prompt_ids == [1, 75, 108]
    assert prepare(b'{"prompt": "Hi", "add_special_tokens": false}', False, INFO, LIMITS).prompt_ids == [75, 108]
    msgs = [{"role": "user", "content": "Hi"}]
    with_turn = prepare(json.dumps({"messages": msgs}).encode(), True, INFO, LIMITS).prompt_ids
    without = prepare(json.dumps({"messages": msgs, "add_generation_prompt": False}).encode(), True, INFO,
                      LIMITS).prompt_ids
    assert with_turn == INFO.tokenizer.encode("<|user|>\nHi\n<|assistant|>\n")
    assert without == INFO.tokenizer.encode("<|user|>\nHi\n") == with_turn[:len(without)]
    plain = prepare(json.dumps({"messages": msgs, "add_special_tokens": False}).encode(), True, INFO, LIMITS)
    assert plain.prompt_ids == with_turn[1:]


def test_tokenize_and_detokenize_bodies():
    assert tokenize(b'{"prompt": "Hi"}', INFO) == {"count": 3, "max_model_len": 512, "tokens": [1, 75, 108],
                                                   "token_strs": None}
    assert tokenize(b'{"prompt": "Hi", "add_special_tokens": false, "return_token_strs": true}', INFO) == {
        "count": 2, "max_model_len": 512, "tokens": [75, 108], "token_strs": ["H", "i"]}
    assert detokenize(b'{"tokens": [1, 75, 108, 2]}', INFO) == {"prompt": "<|bos|>Hi<|eos|>"}
    for body, param, code in (({"tokens": [1, 259]}, "tokens", "invalid_value"),
                              ({"tokens": [1, True]}, "tokens", "invalid_type"),
                              ({"tokens": "1,2"}, "tokens", "invalid_type"),
                              ({}, "tokens", "missing_field"),
                              ({"prompt": [1, 2]}, "prompt", "invalid_type"),
                              ({"prompt": "x" * 600}, None, None),
                              ({"prompt": "x" * 4000}, "prompt", "context_length_exceeded"),
                              ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
                               "tools", "missing_field"),
                              ({"prompt": "x", "model": "gpt-4"}, "model", "model_not_found")):
        fn = detokenize if "tokens" in body or not body else tokenize
        if param is None:   # longer than the context but within the text bound: counted, not refused
            assert fn(json.dumps(body).encode(), INFO)["count"] == 601
            continue
        with pytest.raises(ApiError) as e:
            fn(json.dumps(body).encode(), INFO)
        assert (e.value.param, e.value.code) == (param, code), e.value.message


# ---- against a real server -----------------------------------------------------------------------------------
@pytest.fixture
def client(split_server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=split_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=30)


def post(srv, path, body, headers=None):
    return httpx.post(srv.url + path, json=body, headers=srv.headers if headers is None else headers, timeout=30)


def test_models_retrieve(client, split_server):
    import openai

    m = client.models.retrieve("tiny")
    assert (m.id, m.object, m.owned_by) == ("tiny", "model", "splitserve")
    assert m.model_dump()["max_model_len"] == client.models.list().data[0].model_dump()["max_model_len"]
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4")
    assert (e.value.status_code, e.value.code, e.value.param, e.value.type) == (
        404, "model_not_found", "model", "invalid_request_error")
    assert "gpt-4" in e.value.message
    r = httpx.get(split_server.url + "/v1/models/tiny", timeout=10)      # no key
    assert r.status_code == 401 and set(r.json()["error"]) == {"message", "type", "param", "code"}


TEXTS = ["Hello, world", "héllo ✓ 世界 🙂", " spaces  and\ttabs\n", "<|eos|> literally"]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_detokenize_round_trip_equals_the_engines_tokenizer(split_server, reference_engine, client, text):
    tok = reference_engine.tokenizer
    r = post(split_server, "/tokenize", {"model": "tiny", "prompt": text})
    assert r.status_code == 200, r.text
    js = r.json()
    assert js["tokens"] == tok.encode(text) and js["count"] == len(js["tokens"])
    assert js["max_model_len"] == client.models.retrieve("tiny").model_dump()["max_model_len"]
    d = post(split_server, "/detokenize", {"model": "tiny", "tokens": js["tokens"]})
    assert d.status_code == 200 and d.json() == {"prompt": tok.decode(js["tokens"], skip_special_tokens=False)}
    back = post(split_server, "/tokenize", {"prompt": d.json()["prompt"], "add_special_tokens": False}).json()
    assert back["tokens"] == js["tokens"]                  # special tokens kept, and read back as themselves
    # what /v1/completions runs for the same text
    c = client.completions.create(model="tiny", prompt=text, max_tokens=1, temperature=0)
    assert c.usage.prompt_tokens == js["count"]


def test_tokenize_chat_is_what_chat_completions_runs(split_server, reference_engine, client):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    js = post(split_server, "/tokenize", {"model": "tiny", "messages": msgs}).json()
    assert js["tokens"] == reference_engine.tokenizer.encode(default_chat_text(msgs))
    c = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=1, temperature=0)
    assert c.usage.prompt_tokens == js["count"]
    no_turn = post(split_server, "/tokenize", {"messages": msgs, "add_generation_prompt": False}).json()
    assert no_turn["tokens"] == js["tokens"][:no_turn["count"]] and no_turn["count"] < js["count"]
    assert post(split_server, "/tokenize", {"prompt": "x"}, headers={}).status_code == 401
    assert post(split_server, "/detokenize", {"tokens": [1]}, headers={}).status_code == 401


@pytest.mark.parametrize("chat", [False, True])
def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk(client, chat):
    opts = {"include_usage": True, "continuous_usage_stats": True}
    if chat:
        stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=6, temperature=0, stream=True, stream_options=opts,
                                                extra_body={"ignore_eos": True})
    else:
        stream = client.completions.create(model="tiny", prompt="Hi", max_tokens=6, temperature=0, stream=True,
                                           stream_options=opts, extra_body={"ignore_eos": True})
    chunks = list(stream)
    n_prompt = chunks[-1].usage.prompt_tokens
    seen = 0
    for c in chunks:
        if c.choices:
            seen += len(c.choices[0].model_dump().get("token_ids") or [])
        assert c.usage is not None and (c.usage.prompt_tokens, c.usage.completion_tokens,
                                        c.usage.total_tokens) == (n_prompt, seen, n_prompt + seen)
    assert seen == 6 and n_prompt == (3 if not chat else len(INFO.tokenizer.encode("<|user|>\nHi\n<|assistant|>\n")))


def test_version(split_server):
    r = httpx.get(split_server.url + "/version", timeout=10)
    assert r.status_code == 200 and r.json() == {"version": importlib.metadata.version("splitserve")}


def test_openapi_lists_the_routes_and_the_request_schemas(split_server):
    r = httpx.get(split_server.url + "/openapi.json", timeout=10)
    assert r.status_code == 200
    spec = r.json()
    assert spec["info"]["version"] == importlib.metadata.version("splitserve")
    want = {"/v1/completions": "post", "/v1/chat/completions": "post", "/tokenize": "post", "/detokenize": "post",
            "/v1/models": "get", "/v1/models/{model_id}": "get", "/version": "get", "/health": "get",
            "/metrics": "get", "/debug/state": "get", "/v1/responses": "post", "/v1/responses/{response_id}": "get"}
    assert {p: m for p, item in spec["paths"].items() for m in item} == want
    schemas = spec["components"]["schemas"]
    body = spec["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/CompletionRequest"}
    comp = schemas["CompletionRequest"]["properties"]
    for name in ("model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "stop", "stream", "echo",
                 "stream_options", "seed", "logit_bias", "ignore_eos", "add_special_tokens"):
        assert name in comp, name
    assert comp["temperature"]["maximum"] == 2 and comp["max_tokens"]["anyOf"][0]["minimum"] == 1
    assert "messages" in schemas["ChatCompletionRequest"]["properties"]
    assert not set(UNSUPPORTED) & set(comp)                # refused fields are not documented as fields
    tok = spec["paths"]["/tokenize"]["post"]
    assert tok["requestBody"]["content"]["application/json"]["schema"] == {"anyOf": [
        {"$ref": "#/components/schemas/TokenizeCompletionRequest"}, {"$ref": "#/components/schemas/TokenizeChatRequest"}]}
    assert set(schemas["TokenizeResponse"]["properties"]) == {"count", "max_model_len", "tokens", "token_strs"}
    assert all(ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas
               for ref in _refs(spec))                     # every reference resolves
    d = httpx.get(split_server.url + "/docs", timeout=10)
    assert d.status_code == 200 and "swagger" in d.text.lower() and "/openapi.json" in d.text


def _refs(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "$ref":
                yield v
            else:
                yield from _refs(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _refs(v)


def test_the_client_gets_a_400_naming_each_unimplemented_field(client):
    import openai

    calls = {
        "suffix": lambda: client.completions.create(model="tiny", prompt="Hi", max_tokens=2, suffix="end"),
        "modalities": lambda: client.completions.create(model="tiny", prompt="Hi", max_tokens=2,
                                                        extra_body={"modalities": ["text", "audio"]}),
    }
    for field in UNSUPPORTED:   # the rest as a vLLM user sends them: extra_body
        calls.setdefault(field, lambda f=field: client.completions.create(
            model="tiny", prompt="Hi", max_tokens=2, extra_body={f: ASKING[f]}))
    for field, call in calls.items():
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert (e.value.status_code, e.value.param, e.value.code) == (400, field, "unsupported"), field
        assert f"'{field}'" in e.value.message
    # implemented fields are still accepted, and change what runs
    a = client.completions.create(model="tiny", prompt="Hi", max_tokens=1, temperature=0)
    b = client.completions.create(model="tiny", prompt="Hi", max_tokens=1, temperature=0,
                                  extra_body={"add_special_tokens": False, "top_k": 5, "ignore_eos": True})
    assert (a.usage.prompt_tokens, b.usage.prompt_tokens) == (3, 2)


# the fields that only describe a request (issue 45 item 4): accepted, as vLLM does
DESCRIBED = {"user": "user-1", "safety_identifier": "h1", "metadata": {"k": "v"}, "store": True,
             "service_tier": "flex", "reasoning_effort": "low", "prompt_cache_key": "k"}


def test_fields_that_describe_a_request_are_accepted_and_change_nothing(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi", "name": "bob"}]
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
    described = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                               **DESCRIBED)
    assert described.choices[0].message.content == plain.choices[0].message.content
    assert described.usage.prompt_tokens == plain.usage.prompt_tokens    # the default template shows no name


@pytest.mark.parametrize("field,value", [("user", 5), ("metadata", {"k": 1}), ("metadata", {str(i): "v" for i in
                                         range(17)}), ("store", "yes"), ("service_tier", "fast"),
                                         ("reasoning_effort", "max"), ("prompt_cache_key", ["k"])])
def test_a_described_field_of_the_wrong_shape_is_refused(field, value):
    e = err({"prompt": [1], field: value})
    assert e.status == 400 and e.param == field and e.code in ("invalid_type", "invalid_value")


def test_a_message_name_reaches_a_chat_template():
    from splitserve.serve.openai_io import render_chat
    from splitserve.serve.prompts import chat_messages

    info = dataclasses.replace(INFO, chat_template="{% for m in messages %}[{{ m.name or m.role }}]{{ m.content }}"
                                                   "{% endfor %}")
    msgs = chat_messages([{"role": "user", "content": "hi", "name": "bob"}, {"role": "user", "content": "yo"}])
    assert render_chat(msgs, info) == "[bob]hi[user]yo"
    e = err({"messages": [{"role": "user", "content": "hi", "name": 7}]}, chat=True)
    assert e.param == "messages" and "name" in e.message


def test_tools_are_for_chat_completions_only():
    tool = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for field, value in (("tools", tool), ("tool_choice", "auto"), ("parallel_tool_calls", False)):
        e = err({"prompt": [1], field: value})
        assert (e.param, e.code) == (field, "unsupported") and "/v1/chat/completions" in e.message
    e = err({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, chat=True)
    assert (e.param, e.code) == ("tool_choice", "invalid_value")
    e = err({"messages": [{"role": "user", "content": "hi", "tool_calls": [{"id": "c"}]}]}, chat=True)
    assert e.param == "messages" and "tool_calls" in e.message
