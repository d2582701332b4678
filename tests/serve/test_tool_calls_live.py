"""Tool calls on chat completions with the official `openai` client (issue 45 item 1), on a
Splitwise 1P + 1T server (one grammar walked by both workers) and an unsplit one, streamed and not:
a named function and `required` force a call whose arguments follow the tool's schema (checked
with jsonschema), `parallel_tool_calls` false makes it one call, `auto` and `none` leave the text
free (the tiny model writes no call of its own), and a conversation carrying earlier calls and
their results is taken. Streamed, the calls come as OpenAI streams them (a first delta naming
each call, then its arguments in fragments), read by the SDK's own stream helper, and equal the
same request's calls unstreamed. serve/tool_stream.py's parser and tools.py's grammar are checked
on hand-written text, the parser cut at any points."""

from __future__ import annotations

import json

import openai
import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.serve.tool_stream import ToolStream, deltas, parse
from splitserve.serve.tools import ToolPlan, grammar

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


@pytest.mark.parametrize("choice", ["named", "required"])
def test_streamed_calls_come_as_openai_streams_them(server, choice):
    # the SDK's stream helper (client.chat.completions.stream) reads the chunks; its accumulated
    # calls equal the unstreamed answer's (same seed, same tokens), the arguments in many pieces
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=server.api_key or "none", max_retries=0)
    tool_choice = {"type": "function", "function": {"name": "get_weather"}} if choice == "named" else "required"
    kw = dict(model="tiny", messages=ASK, tools=LIVE, temperature=1.0, seed=5, max_tokens=100, tool_choice=tool_choice,
              parallel_tool_calls=False)
    whole = client.chat.completions.create(**kw).choices[0]
    firsts, fragments = [], []
    with client.chat.completions.stream(**kw) as s:
        for ev in s:
            if ev.type == "chunk":
                for d in ev.chunk.choices[0].delta.tool_calls or []:
                    if d.id is not None:      # a call's first delta: its index, id, type and name, no arguments
                        firsts.append((d.index, d.type, d.function.name, d.function.arguments))
                    else:                      # then only arguments
                        assert d.function.name is None and d.function.arguments
            elif ev.type == "tool_calls.function.arguments.delta":
                fragments.append(ev.arguments_delta)
        final = s.get_final_completion().choices[0]
    assert final.finish_reason == whole.finish_reason == "tool_calls"
    assert firsts == [(0, "function", "get_weather", "")]
    got = [(c.function.name, c.function.arguments) for c in final.message.tool_calls]
    assert got == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert len(fragments) > 1 and "".join(fragments) == got[0][1] and valid(final.message.tool_calls[0].model_dump())
    assert final.message.content is None and whole.message.content is None


TEXTS = [
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris}", "days": [1, {"a": 2}]}}\n'
    '</tool_call>\n<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call>\n'
    '<tool_call>{"name": "get_time", "arguments": {"utc": true}}</tool_call> done <tool',
    '<tool_call>{"arguments": {"utc": false}, "name": "get_time"}</tool_call>'
    '<tool_call>{"name": "get_time", "parameters": "{\\"utc\\": true}"}</tool_call>\n\n',
    '  plain text, < and <tool and <tool_call>{not json}</tool_call> <tool_call>{"name": "get_time", "arguments": {',
]


def test_the_stream_reader_gives_calls_as_openai_sends_them():
    s = ToolStream(PLAN)
    ds = [d for ch in TEXTS[0] for d in deltas(s.push(ch))] + deltas(s.finish())   # a character at a time
    first = next(k for k, d in enumerate(ds) if "tool_calls" in d)
    assert "".join(d["content"] for d in ds[:first]) == "Let me check."   # the text before the call as content
    head = ds[first]["tool_calls"][0]
    assert head["index"] == 0 and head["type"] == "function" and head["id"].startswith("call_")
    assert head["function"] == {"name": "get_weather", "arguments": ""}
    args = [d["tool_calls"][0]["function"]["arguments"] for d in ds[first + 1:] if "tool_calls" in d and
            "id" not in d["tool_calls"][0] and d["tool_calls"][0]["index"] == 0]
    assert "".join(args) == '{"city": "Pa\\"ris}", "days": [1, {"a": 2}]}'   # as written, one piece a character
    assert len(args) == len("".join(args))
    content, calls = parse(TEXTS[0], PLAN)
    assert content == 'Let me check.\n\n<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call>\n done <tool'
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    # a block of another shape is read whole; string arguments are given decoded
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in parse(TEXTS[1], PLAN)[1]] == [
        ("get_time", '{"utc": false}'), ("get_time", '{"utc": true}')]
    assert parse(TEXTS[1], PLAN)[0] is None
    content, calls = parse(TEXTS[2], PLAN)    # an unfinished call keeps what was written of its arguments
    assert content == "  plain text, < and <tool and <tool_call>{not json}</tool_call>"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("get_time", "{")]
    assert parse(TEXTS[2][:-60], PLAN) == (TEXTS[2][:-60], [])    # without calls: the text as written


def _streamed(text: str, cuts: list[int], plan: ToolPlan) -> tuple[str | None, list]:
    s, items, at = ToolStream(plan), [], 0
    for c in sorted(cuts) + [len(text)]:
        items += s.push(text[at:c])
        at = c
    content, calls = "", {}
    for d in deltas(items + s.finish()):
        content += d.get("content", "")
        for t in d.get("tool_calls", []):
            c = calls.setdefault(t["index"], {"name": t["function"].get("name"), "arguments": ""})
            c["arguments"] += t["function"]["arguments"]
    return (content or None) if calls else content, [calls[k] for k in sorted(calls)]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(TEXTS), st.lists(st.integers(0, 400), max_size=30), st.booleans())
def test_the_stream_reader_gives_the_same_calls_cut_anywhere(text, cuts, parallel):
    plan = ToolPlan(PLAN.tools, "auto", parallel)
    content, calls = parse(text, plan)
    assert _streamed(text, [c for c in cuts if c <= len(text)], plan) == (
        content, [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls])
