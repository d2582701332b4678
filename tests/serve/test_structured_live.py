"""Structured output through `serve` with the official `openai` client (issue 28 item 5):
`response_format` json_schema and json_object, completions and chat, streaming and not, on a
Splitwise 1P + 1T server (the first token sampled on the prompt worker, the rest on the token
worker, one grammar across both) and an unsplit one. Every answer parses and follows its schema
(jsonschema's validator) and equals the engine's own constrained sampling with the same seed; a
schema the grammar library cannot use is refused with 400 before it reaches a worker."""

from __future__ import annotations

import json

import openai
import pytest

from splitserve.engine.sampler import SamplingParams
from splitserve.serve.schema import COMPACT_JSON

llguidance = pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "score", "tags"],
          "properties": {"answer": {"enum": ["yes", "no"]}, "score": {"type": "integer", "minimum": 0, "maximum": 9},
                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}}}
PROMPTS = [[1] + [(17 * i + 5 * k) % 250 + 3 for i in range(10 + 6 * k)] for k in range(4)]
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}


@pytest.fixture(params=["split_server", "single_server"])
def server(request):
    return request.getfixturevalue(request.param)


def client_of(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.api_key or "none", max_retries=0)


def engine_json(engine, prompt: list[int], schema: dict, seed: int) -> list[int]:
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=COMPACT_JSON)
    return engine.generate([prompt], [SamplingParams(max_tokens=60, temperature=1.0, seed=seed,
                                                     grammar=grammar)])[0].token_ids


@pytest.mark.parametrize("stream", [False, True])
def test_completions_follow_the_schema(server, reference_engine, stream):
    client = client_of(server)
    for seed, prompt in enumerate(PROMPTS):
        kw = dict(model="tiny", prompt=prompt, max_tokens=60, temperature=1.0, seed=seed,
                  extra_body={"response_format": FORMAT})
        if stream:
            chunks = list(client.completions.create(stream=True, **kw))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            ids = [t for c in chunks if c.choices for t in c.choices[0].model_extra["token_ids"]]
            reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            r = client.completions.create(**kw)
            text, ids, reason = r.choices[0].text, r.choices[0].model_extra["token_ids"], r.choices[0].finish_reason
        assert reason == "stop"
        jsonschema.validate(json.loads(text), SCHEMA)
        assert ids == engine_json(reference_engine, prompt, SCHEMA, seed)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_json_object_and_schema(server, stream):
    client = client_of(server)
    messages = [{"role": "user", "content": "Give me JSON."}]
    for fmt, schema in (({"type": "json_object"}, {"type": "object"}), (FORMAT, SCHEMA)):
        kw = dict(model="tiny", messages=messages, max_tokens=60, temperature=1.0, seed=3, response_format=fmt)
        if stream:
            chunks = [c for c in client.chat.completions.create(stream=True, **kw) if c.choices]
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            r = client.chat.completions.create(**kw)
            text, reason = r.choices[0].message.content, r.choices[0].finish_reason
        if reason == "stop":
            jsonschema.validate(json.loads(text), schema)
        else:  # an object of free strings need not close within 60 tokens; the schema's must
            assert fmt["type"] == "json_object" and reason == "length" and text.startswith('{"')


def test_a_schema_that_cannot_be_used_is_refused(split_server):
    client = client_of(split_server)
    for fmt in ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
                {"type": "json_schema", "json_schema": {"name": "x"}},
                {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": ["a" * 20000]}}}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                           response_format=fmt)
        assert e.value.body["param"] == "response_format", e.value.body


def test_an_open_schema_is_closed_so_the_answer_ends(server):
    # no additionalProperties: read as false (vLLM's xgrammar strict mode, OpenAI's strict mode), so
    # the random model cannot add keys until max_tokens
    schema = {"type": "object", "required": ["answer"], "properties": {"answer": {"enum": ["yes", "no"]}}}
    client = client_of(server)
    for seed in range(3):
        r = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=60, temperature=1.0, seed=seed,
                                      extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                          "name": "a", "schema": schema}}})
        assert r.choices[0].finish_reason == "stop" and set(json.loads(r.choices[0].text)) == {"answer"}
