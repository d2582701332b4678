"""OpenAI's Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`) over the chat path: a
request's `instructions`, `input` items and function tools become a chat completion's messages
and tools (`chat_body`), the chat answer becomes a response's output items (`response_object`),
and a streamed chat answer becomes the Responses API's events (`events`: response.created, an
output item and its text deltas, function calls whole, response.completed). The responses are
kept in memory, the newest `keep` of them, so that `previous_response_id` continues one (its
input and output items before the new input; its instructions are not carried over, as OpenAI's
are not) and `GET /v1/responses/{id}` returns one.

Input items taken: messages (`role` and text `content`, or `input_text` / `output_text` parts),
`function_call` and `function_call_output`; tools: `function`; text formats: `text`,
`json_object`, `json_schema`. Anything else is refused by name (400), as refusals.py does for the
other endpoints."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import Response, StreamingResponse

from .bodies import ResponsesRequest, validate
from .completions import json_response
from .ids import unique_hex
from .openai_io import ApiError, ModelInfo, bad, dumps, parse_json

# fields of the Responses API that ask for what this server does not do -> the values that ask nothing
UNSUPPORTED: dict[str, tuple[object, ...]] = {
    "background": (None, False), "conversation": (None,), "prompt": (None,), "include": (None, []),
    "max_tool_calls": (None,), "top_logprobs": (None, 0), "truncation": (None, "disabled"),
    "context_management": (None,), "prompt_cache_retention": (None,), "stream_options": (None,)}
_ECHOED = ("instructions", "max_output_tokens", "metadata", "parallel_tool_calls", "previous_response_id",
           "temperature", "top_p", "user")


def _new_id(prefix: str) -> str:
    return f"{prefix}_{unique_hex()}"


def request_of(raw: bytes, info: ModelInfo) -> ResponsesRequest:
    """The checked request; 400 for a field or item not implemented."""
    body = parse_json(raw)
    m = validate(ResponsesRequest, body)
    if m.model is not None and m.model != info.name:
        raise ApiError(404, f"the model '{m.model}' does not exist; this server serves '{info.name}'",
                       "invalid_request_error", "model", "model_not_found")
    for name, ok in UNSUPPORTED.items():
        if body.get(name) not in ok:
            raise bad(f"'{name}' is not supported by this server", name, "unsupported")
    return m


def chat_body(m: ResponsesRequest, conversation: list[dict]) -> dict:
    """The chat completion request of a Responses request whose messages, its instructions left
    out, are `conversation` (a previous response's, then its input's)."""
    messages = ([{"role": "system", "content": m.instructions}] if m.instructions else []) + conversation
    chat: dict[str, Any] = {"messages": messages, "temperature": m.temperature, "top_p": m.top_p, "stream": m.stream}
    if m.stream:
        chat["stream_options"] = {"include_usage": True}
    if m.max_output_tokens is not None:
        chat["max_tokens"] = m.max_output_tokens
    if m.tools:
        chat["tools"] = [_chat_tool(t) for t in m.tools]
        chat["parallel_tool_calls"] = m.parallel_tool_calls
    if m.tool_choice is not None:
        chat["tool_choice"] = _chat_choice(m.tool_choice)
    fmt = (m.text or {}).get("format")
    if fmt:
        chat["response_format"] = _chat_format(fmt)
    for k in ("user", "metadata", "safety_identifier", "prompt_cache_key", "service_tier"):
        if getattr(m, k) is not None:
            chat[k] = getattr(m, k)
    return chat


def input_messages(items: Any) -> list[dict]:
    """Chat messages of a Responses `input`: a text is a user message; function calls in a row
    are one assistant message's tool_calls, each output a tool message."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad("'input' must be a text or a non-empty list of items", "input", "invalid_type")
    out: list[dict] = []
    for i, it in enumerate(items):
        kind = it.get("type", "message") if isinstance(it, dict) else None
        if kind == "message":
            out.append({"role": it.get("role"), "content": _text(i, it.get("content"))})
        elif kind == "function_call":
            call = {"id": it.get("call_id"), "type": "function",
                    "function": {"name": it.get("name"), "arguments": it.get("arguments")}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") and not out[-1]["content"]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = it.get("output")
            out.append({"role": "tool", "tool_call_id": it.get("call_id"),
                        "content": output if isinstance(output, str) else json.dumps(output)})
        else:
            raise bad(f"input[{i}]: items of type {kind!r} are not supported by this server", "input", "unsupported")
    return out


def _text(i: int, content: Any) -> Any:
    """A message item's content as chat's: a text, or its input_text / output_text parts' texts."""
    if not isinstance(content, list):
        return content
    parts = []
    for p in content:
        if not isinstance(p, dict) or p.get("type") not in ("input_text", "output_text", "text"):
            raise bad(f"input[{i}].content: only text parts are supported", "input", "unsupported")
        parts.append({"type": "text", "text": p.get("text")})
    return parts


def _chat_tool(t: dict) -> dict:
    if t.get("type") != "function":
        raise bad(f"tools of type {t.get('type')!r} are not supported by this server", "tools", "unsupported")
    return {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters", "strict")
                                             if t.get(k) is not None}}


def _chat_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if choice in ("none", "auto", "required"):
        return choice
    raise bad("'tool_choice' must be none, auto, required or a function", "tool_choice", "unsupported")


def _chat_format(fmt: Any) -> dict:
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad("'text.format' must be text, json_object or json_schema", "text", "unsupported")
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description")
                                                   if k in fmt}}


def output_items(message: dict) -> list[dict]:
    """A chat answer's message as Responses output items: its text, then its function calls."""
    items: list[dict] = []
    if message.get("content") or not message.get("tool_calls"):
        items.append({"type": "message", "id": _new_id("msg"), "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": message.get("content") or "", "annotations": [],
                                   "logprobs": []}]})
    for c in message.get("tool_calls") or []:
        items.append({"type": "function_call", "id": _new_id("fc"), "call_id": c["id"], "name": c["function"]["name"],
                      "arguments": c["function"]["arguments"], "status": "completed"})
    return items


def response_object(rid: str, m: ResponsesRequest, info: ModelInfo, output: list[dict], finish: str | None,
                    usage: dict | None, created: float) -> dict:
    """The Response of `output` items ("incomplete" where the answer ran out of max_output_tokens)."""
    u = usage or {}
    cut = finish == "length"
    return {"id": rid, "object": "response", "created_at": created, "model": info.name,
            "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
            "output": output, "tools": m.tools or [], "tool_choice": m.tool_choice or "auto",
            "text": m.text or {"format": {"type": "text"}}, "reasoning": None, "store": m.store is not False,
            "usage": {"input_tokens": u.get("prompt_tokens", 0),
                      "input_tokens_details": {"cached_tokens": (u.get("prompt_tokens_details") or {}).get(
                          "cached_tokens", 0)},
                      "output_tokens": u.get("completion_tokens", 0), "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": u.get("total_tokens", 0)},
            **{k: getattr(m, k) for k in _ECHOED}}


def history_of(r: dict, kept_input: list[dict]) -> list[dict]:
    """The chat messages a continuation of stored response `r` starts with: its input's, then its
    output's."""
    out = list(kept_input)
    text = "".join(p["text"] for it in r["output"] if it["type"] == "message" for p in it["content"])
    calls = [{"id": it["call_id"], "type": "function", "function": {"name": it["name"], "arguments": it["arguments"]}}
             for it in r["output"] if it["type"] == "function_call"]
    out.append({"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})})
    return out


class Kept:
    """The newest `keep` responses and each one's conversation (its chat messages, instructions
    left out), for previous_response_id and GET /v1/responses/{id}."""

    def __init__(self, keep: int = 1024) -> None:
        self.keep = keep
        self.items: OrderedDict[str, tuple[dict, list[dict]]] = OrderedDict()

    def put(self, r: dict, messages: list[dict]) -> None:
        self.items[r["id"]] = (r, messages)
        while len(self.items) > self.keep:
            self.items.popitem(last=False)

    def get(self, rid: str, param: str) -> tuple[dict, list[dict]]:
        if rid not in self.items:
            raise ApiError(404, f"no response with id '{rid}' is kept here (the newest {self.keep} are)",
                           "invalid_request_error", param, "not_found")
        return self.items[rid]


def sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {dumps(event).decode()}\n\n"


async def events(chunks: AsyncIterator, rid: str, m: ResponsesRequest, info: ModelInfo, created: float,
                 done: Any) -> AsyncIterator[str]:
    """The Responses API's events of a streamed chat answer (its `data:` chunks); `done(response)`
    is called with the finished response before the last event."""
    seq = iter(range(1 << 62))
    start = response_object(rid, m, info, [], None, None, created)
    start["status"] = "in_progress"
    for kind in ("response.created", "response.in_progress"):
        yield sse({"type": kind, "sequence_number": next(seq), "response": start})
    msg_id, text, finish, usage = _new_id("msg"), "", None, None
    calls: dict[int, dict] = {}
    opened = False
    async for raw in chunks:
        for line in (raw.decode() if isinstance(raw, bytes) else raw).split("\n"):
            if not line.startswith("data: {"):
                continue
            c = json.loads(line[6:])
            if "error" in c:
                yield sse({"type": "error", "sequence_number": next(seq), **c["error"]})
                return
            usage = c.get("usage") or usage
            for ch in c.get("choices", []):
                piece = ch["delta"].get("content") or ""
                for d in ch["delta"].get("tool_calls") or []:   # a call's first delta, then its arguments
                    call = calls.setdefault(d["index"], {"id": d.get("id"), "function": {"name": "", "arguments": ""}})
                    call["function"]["name"] += d["function"].get("name") or ""
                    call["function"]["arguments"] += d["function"].get("arguments") or ""
                finish = ch.get("finish_reason") or finish
                if piece:
                    if not opened:
                        opened = True
                        for e in _message_opening(msg_id):
                            yield sse({**e, "sequence_number": next(seq)})
                    text += piece
                    yield sse({"type": "response.output_text.delta", "sequence_number": next(seq), "item_id": msg_id,
                               "output_index": 0, "content_index": 0, "delta": piece, "logprobs": []})
    output = output_items({"content": text, "tool_calls": [calls[k] for k in sorted(calls)]})
    if opened:
        output[0]["id"] = msg_id
    for e in _items_done(output, opened):
        yield sse({**e, "sequence_number": next(seq)})
    r = response_object(rid, m, info, output, finish, usage, created)
    done(r)
    yield sse({"type": "response.incomplete" if r["status"] == "incomplete" else "response.completed",
               "sequence_number": next(seq), "response": r})


def _message_opening(msg_id: str) -> list[dict]:
    item = {"type": "message", "id": msg_id, "status": "in_progress", "role": "assistant", "content": []}
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    return [{"type": "response.output_item.added", "output_index": 0, "item": item},
            {"type": "response.content_part.added", "item_id": msg_id, "output_index": 0, "content_index": 0,
             "part": part}]


def _items_done(output: list[dict], opened: bool) -> list[dict]:
    """The events that close each output item (those not opened by text deltas opened here)."""
    out: list[dict] = []
    for i, it in enumerate(output):
        if it["type"] == "message":
            part = it["content"][0]
            if not opened:
                out += [{**e, "output_index": i} for e in _message_opening(it["id"])]
            out += [{"type": "response.output_text.done", "item_id": it["id"], "output_index": i, "content_index": 0,
                     "text": part["text"], "logprobs": []},
                    {"type": "response.content_part.done", "item_id": it["id"], "output_index": i,
                     "content_index": 0, "part": part}]
        else:
            out += [{"type": "response.output_item.added", "output_index": i, "item": {**it, "status": "in_progress",
                                                                                       "arguments": ""}},
                    {"type": "response.function_call_arguments.delta", "item_id": it["id"], "output_index": i,
                     "delta": it["arguments"]},
                    {"type": "response.function_call_arguments.done", "item_id": it["id"], "output_index": i,
                     "name": it["name"], "arguments": it["arguments"]}]
        out.append({"type": "response.output_item.done", "output_index": i, "item": it})
    return out


def now() -> float:
    return float(int(time.time()))


class ResponsesEndpoint:
    """POST /v1/responses through `gen` (completions.Completions: the chat path), and the kept
    responses for GET /v1/responses/{id}."""

    def __init__(self, gen, info: ModelInfo, keep: int = 1024) -> None:
        self.gen, self.info, self.kept = gen, info, Kept(keep)

    async def create(self, raw: bytes) -> Response:
        m = request_of(raw, self.info)
        history = []
        if m.previous_response_id is not None:
            prev, prev_messages = self.kept.get(m.previous_response_id, "previous_response_id")
            history = history_of(prev, prev_messages)
        conversation = history + input_messages(m.input)
        chat = chat_body(m, conversation)
        rid, created = _new_id("resp"), now()
        answer = await self.gen.generate(dumps(chat), True)
        if m.stream:
            return StreamingResponse(events(answer.body_iterator, rid, m, self.info, created,
                                            lambda r: self.kept.put(r, conversation)),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        c = json.loads(answer.body)
        choice = c["choices"][0]
        r = response_object(rid, m, self.info, output_items(choice["message"]), choice["finish_reason"], c["usage"],
                            created)
        self.kept.put(r, conversation)
        return json_response(r)

    def retrieve(self, rid: str) -> dict:
        return self.kept.get(rid, "response_id")[0]
