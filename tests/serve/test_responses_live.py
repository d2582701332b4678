"""OpenAI's Responses API on `serve` with the official `openai` client (issue 45 item 2), split and
unsplit: a response's text equals the chat completion of the same messages token for token,
`previous_response_id` continues a kept response (its prompt is the conversation's, counted by
chat completions), function tools give `function_call` items whose output goes back as
`function_call_output`, the streamed events carry the same text as deltas and end with the
response, and what is not implemented is refused by name."""

from __future__ import annotations

import json

import openai
import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

CITY = {"type": "object", "additionalProperties": False, "required": ["city"],
        "properties": {"city": {"enum": ["Paris", "Lima"]}}}
TOOLS = [{"type": "function", "name": "get_weather", "parameters": CITY}]


@pytest.fixture(params=["split_server", "single_server"])
def client(request):
    srv = request.getfixturevalue(request.param)
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.api_key or "none", max_retries=0)


def chat_text(client, messages: list[dict], n: int) -> tuple[str, int]:
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=n, temperature=0)
    return r.choices[0].message.content, r.usage.prompt_tokens


def test_a_response_and_its_continuation_are_the_chat_completions(client):
    r = client.responses.create(model="tiny", input="Hello", instructions="Be brief.", max_output_tokens=8,
                                temperature=0)
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    assert (r.output_text, r.usage.input_tokens) == chat_text(client, first, 8)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 8 and r.output[0].type == "message"
    again = client.responses.create(model="tiny", input="Again", previous_response_id=r.id, max_output_tokens=6,
                                    temperature=0)
    history = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": r.output_text},
               {"role": "user", "content": "Again"}]       # instructions are not carried over
    assert (again.output_text, again.usage.input_tokens) == chat_text(client, history, 6)
    assert client.responses.retrieve(r.id).output_text == r.output_text


def test_function_tools_give_calls_and_take_their_outputs(client):
    r = client.responses.create(model="tiny", input="Weather?", tools=TOOLS, tool_choice="required",
                                parallel_tool_calls=False, max_output_tokens=80, temperature=1.0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), CITY)
    named = client.responses.create(model="tiny", input="Weather?", tools=TOOLS, max_output_tokens=80,
                                    tool_choice={"type": "function", "name": "get_weather"}, temperature=1.0)
    assert [o.name for o in named.output if o.type == "function_call"] == ["get_weather"]
    after = client.responses.create(model="tiny", previous_response_id=r.id, tools=TOOLS, max_output_tokens=4,
                                    temperature=0, input=[{"type": "function_call_output",
                                                           "call_id": calls[0].call_id, "output": "sunny"}])
    assert after.output[0].type == "message" and after.usage.input_tokens > r.usage.input_tokens


def test_streamed_events_carry_the_same_answer(client):
    whole = client.responses.create(model="tiny", input="Hello", max_output_tokens=8, temperature=0)
    events = list(client.responses.create(model="tiny", input="Hello", max_output_tokens=8, temperature=0,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == whole.output_text
    with client.responses.stream(model="tiny", input="Weather?", tools=TOOLS, tool_choice="required",
                                 parallel_tool_calls=False, max_output_tokens=80) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    jsonschema.validate(json.loads(final.output[0].arguments), CITY)


def test_what_is_not_implemented_is_refused_by_name(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="tiny", input="Hi", previous_response_id="resp_none")
    assert e.value.body["param"] == "previous_response_id"
    for kw, param in ((dict(background=True), "background"), (dict(include=["file_search_call.results"]), "include"),
                      (dict(input=[{"type": "reasoning", "summary": []}]), "input"),
                      (dict(tools=[{"type": "web_search"}]), "tools")):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="tiny", **{"input": "Hi", **kw})
        assert e.value.body["param"] == param and e.value.body["code"] == "unsupported", kw
