"""Tool calls on chat completions with the official `openai` client (issue 45 item 1), on a
Splitwise 1P + 1T server (one grammar walked by both workers) and an unsplit one, streamed and not:
a named function and `required` force a call whose arguments follow the tool's schema (checked
with jsonschema), `parallel_tool_calls` false makes it one call, `auto` and `none` leave the text
free (the tiny model writes no call of its own), and a conversation carrying earlier calls and
their results is taken. serve/tools.py's parser and grammar are checked on hand-written text."""

from __future__ import annotations

import json

import openai
import pytest

from splitserve.serve.tools import ToolPlan, grammar, parse

llguidance = pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

# small: the tiny model's context is 512 byte tokens, the tools' JSON part of the prompt
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"enum": ["Paris", "Lima"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
TIME = {"type": "object", "additionalProperties": False, "required": ["utc"], "properties": {"utc": {"type": "boolean"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
LIVE = TOOLS[:1]   # what the live requests offer: one tool leaves the output room in the context
ASK = [{"role": "user", "content": "Weather?"}]


@pytest.fixture(params=["split_server", "single_server"])
def server(request):
    return request.getfixturevalue(request.param)


def chat(srv, stream: bool, **kw) -> tuple[str | None, list[dict], str]:
    """(content, tool calls as plain dicts, finish reason) of one chat completion."""
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.api_key or "none", max_retries=0)
    kw = dict(model="tiny", messages=ASK, tools=LIVE, temperature=1.0, **{"max_tokens": 100, **kw})
    if not stream:
        r = client.chat.completions.create(**kw)
        m = r.choices[0].message
        return m.content, [c.model_dump() for c in m.tool_calls or []], r.choices[0].finish_reason
    content, calls, reason = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:     # as the openai SDK's own accumulator reads them
                c = calls.setdefault(d.index, {"id": d.id, "type": d.type, "function": {"name": "", "arguments": ""}})
                c["function"]["name"] += d.function.name or ""
                c["function"]["arguments"] += d.function.arguments or ""
            reason = ch.finish_reason or reason
    return content or None, [calls[k] for k in sorted(calls)], reason


def valid(call: dict, names=("get_weather", "get_time")) -> bool:
    f = call["function"]
    jsonschema.validate(json.loads(f["arguments"]), SCHEMAS[f["name"]])
    return call["type"] == "function" and call["id"].startswith("call_") and f["name"] in names


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_or_required_tool_choice_gets_a_valid_call(server, stream):
    for seed in range(3):
        named = {"type": "function", "function": {"name": "get_weather"}}
        content, calls, reason = chat(server, stream, seed=seed, tool_choice=named)
        assert reason == "tool_calls" and content is None and len(calls) == 1 and valid(calls[0], ["get_weather"])
        content, calls, reason = chat(server, stream, seed=seed, tool_choice="required", parallel_tool_calls=False)
        assert reason == "tool_calls" and content is None and len(calls) == 1 and valid(calls[0]), calls
        _, calls, reason = chat(server, stream, seed=seed, tool_choice="required", max_tokens=200)
        assert calls and all(valid(c) for c in calls), calls       # one or more, each whole and valid
        assert len({c["id"] for c in calls}) == len(calls)


@pytest.mark.parametrize("stream", [False, True])
def test_auto_and_none_leave_the_text_free(server, stream):
    for choice in ("auto", "none"):
        content, calls, reason = chat(server, stream, seed=1, tool_choice=choice, max_tokens=8)
        assert isinstance(content, str) and calls == [] and reason in ("stop", "length")


def test_a_conversation_with_earlier_calls_and_results(server):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                             "arguments": '{"city": "Lima", "days": 2}'}}
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24 C"}]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=server.api_key or "none", max_retries=0)
    r = client.chat.completions.create(model="tiny", messages=history, tools=LIVE, max_tokens=4, temperature=0)
    assert r.choices[0].message.tool_calls is None and r.usage.prompt_tokens > 150
    with pytest.raises(openai.BadRequestError) as e:     # a call that names no tool of the request
        client.chat.completions.create(model="tiny", messages=ASK, tools=LIVE, max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.param == "tool_choice"


PLAN = ToolPlan(tuple(t["function"] for t in TOOLS), "auto")


def test_the_parser_finds_calls_to_the_tools_and_keeps_the_rest():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}\n'
            '</tool_call>\n<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call>\n'
            '<tool_call>{"name": "get_time", "arguments": {"utc": true}}</tool_call>')
    content, calls = parse(text, PLAN)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 1}), ("get_time", {"utc": True})]
    assert content == 'Let me check.\n\n<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call>'
    assert parse("no calls <tool_call>{not json}</tool_call>", PLAN) == (
        "no calls <tool_call>{not json}</tool_call>", [])
    one = ToolPlan(PLAN.tools, "auto", parallel=False)
    assert len(parse(text, one)[1]) == 1


def test_the_grammars_are_valid_and_name_only_the_chosen_function():
    for plan in (ToolPlan(PLAN.tools, "required"), ToolPlan(PLAN.tools, "get_time"),
                 ToolPlan(PLAN.tools, "required", parallel=False)):
        g = llguidance.LLMatcher.grammar_from_lark(grammar(plan))
        assert llguidance.LLMatcher.validate_grammar(g) == "", plan
    assert "get_weather" not in grammar(ToolPlan(PLAN.tools, "get_time"))
