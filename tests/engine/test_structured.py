"""Structured output in the engine (engine/structured.py, llguidance grammars): by hand, a
one-of-two grammar takes the likelier of its two tokens and stops there; over seeds, every output
of a JSON schema parses and follows it (jsonschema's own validator), greedy and sampled, the
unconstrained output of the same prompts does not; a prompt handed from one engine to another
(InMemoryConnector) gives the same constrained tokens as one engine; a bad grammar is refused."""

from __future__ import annotations

import json

import pytest

from splitserve.engine.engine import LLMEngine
from splitserve.engine.kv_memory import InMemoryConnector
from splitserve.engine.sampler import SamplingParams
from splitserve.errors import UserError

llguidance = pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]},
                                           "name": {"type": "string", "maxLength": 8}},
          "required": ["ok", "n", "name"], "additionalProperties": False}
PROMPTS = [[1] + [(13 * i + 7 * k) % 250 + 3 for i in range(12 + 5 * k)] for k in range(6)]


def json_grammar(schema: dict) -> str:
    return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides={"whitespace_flexible": False})


def test_a_choice_of_two_takes_the_likelier_and_stops():
    eng = LLMEngine("tiny")
    grammar = llguidance.LLMatcher.grammar_from_regex("(a|b)")
    for prompt in PROMPTS:
        free = eng.generate([prompt], [SamplingParams(max_tokens=1, return_logits=True)])[0]
        row = free.logits[0]
        a, b = 3 + ord("a"), 3 + ord("b")  # the tiny tokenizer: byte c is id 3 + c
        want = a if row[a] > row[b] else b
        got = eng.generate([prompt], [SamplingParams(max_tokens=8, grammar=grammar)])[0]
        assert got.token_ids == [want] and got.finish_reason == "stop" and got.text == chr(want - 3)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_output_follows_the_schema(temperature):
    eng = LLMEngine("tiny")
    grammar = json_grammar(SCHEMA)
    params = [SamplingParams(max_tokens=60, temperature=temperature, seed=s, grammar=grammar) for s in range(6)]
    outs = eng.generate(PROMPTS, params)
    for o in outs:
        assert o.finish_reason == "stop"
        jsonschema.validate(json.loads(o.text), SCHEMA)
    free = eng.generate(PROMPTS, [SamplingParams(max_tokens=30, temperature=temperature, seed=s) for s in range(6)])
    for o in free:  # the same model unconstrained writes no such JSON
        with pytest.raises((ValueError, jsonschema.ValidationError)):
            jsonschema.validate(json.loads(o.text), SCHEMA)


def test_a_handed_over_request_follows_the_same_grammar():
    grammar = json_grammar(SCHEMA)
    params = SamplingParams(max_tokens=60, temperature=1.0, seed=5, grammar=grammar)
    want = LLMEngine("tiny").generate([PROMPTS[2]], [params])[0].token_ids
    a_conn, b_conn = InMemoryConnector(), InMemoryConnector()
    a = LLMEngine("tiny", connector=a_conn)
    b = LLMEngine("tiny", connector=b_conn)
    a_conn.send_to("r", b_conn.reserve("r", PROMPTS[2], params))
    first = a.prefill_only(PROMPTS[2], params, request_id="r")
    assert first.finish_reason == "prefill"
    final = None
    while b.has_unfinished():
        for out in b.step():
            if out.finished:
                final = out
    assert final.token_ids == want and final.finish_reason == "stop"
    jsonschema.validate(json.loads(final.text), SCHEMA)


def test_a_bad_grammar_is_refused():
    with pytest.raises(UserError, match="invalid grammar"):
        LLMEngine("tiny").add_request([1, 2, 3], SamplingParams(grammar='{"grammars": [{"lark_grammar": "start: ("}]}'))
