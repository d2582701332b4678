"""A request's prompt as token ids: text (bounded before tokenizing: at most `max_model_len` times
the longest token of the vocabulary, a longer text cannot fit the context), token ids (each in the
vocabulary), or chat messages (text content only) through the chat template."""

from __future__ import annotations

import json
from typing import Any

from .bodies import ChatCompletionRequest, TokenizeChatRequest
from .openai_io import ModelInfo, bad, render_chat
from .refusals import refuse_in_message


def check_text(s: str, param: str) -> None:
    """Text must be valid Unicode: a lone surrogate (JSON "\\ud800") cannot be tokenized."""
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise bad(f"'{param}' contains an unpaired UTF-16 surrogate; send valid Unicode text",
                      param, "invalid_value") from None


def _check_ids(ids: list, info: ModelInfo, param: str) -> list[int]:
    if len(ids) >= info.max_model_len:  # before scanning a huge list
        raise bad(f"the prompt has {len(ids)} tokens but the model's context is {info.max_model_len} tokens",
                  param, "context_length_exceeded")
    for t in ids:
        if not isinstance(t, int) or isinstance(t, bool):
            raise bad(f"'{param}' must be a string or a list of token ids", param, "invalid_type")
        if not 0 <= t < info.vocab_size:
            raise bad(f"token id {t} is outside the vocabulary (0..{info.vocab_size - 1})", param, "invalid_value")
    return list(ids)


def encode_text(text: str, info: ModelInfo, param: str, add_special_tokens: bool = True) -> list[int]:
    """Token ids of `text`; refused before tokenizing when it is too long to fit the context."""
    if info.tokenizer is None:
        raise bad("this model has no tokenizer; send the prompt as a list of token ids", param)
    check_text(text, param)
    if len(text) > info.max_prompt_chars:
        raise bad(f"the prompt has {len(text)} characters, more than the model's context of "
                  f"{info.max_model_len} tokens can hold (at most {info.max_prompt_chars})", param,
                  "context_length_exceeded")
    return info.tokenizer.encode(text, add_special_tokens=add_special_tokens)


def prompt_ids(p: Any, info: ModelInfo, add_special_tokens: bool = True) -> tuple[list[int], str | None]:
    """The prompt as token ids (a string, a list of ids, or a one-element list of either), and its
    text when it came as text."""
    if p is None:
        raise bad("'prompt' is required", "prompt", "missing_field")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        ids, text = encode_text(p, info, "prompt", add_special_tokens), p
    elif isinstance(p, list) and len(p) > 1 and all(isinstance(x, (str, list)) for x in p):
        raise bad("only one prompt per request is supported (got a batch)", "prompt", "unsupported")
    elif isinstance(p, list):
        ids, text = _check_ids(p, info, "prompt"), None
    else:
        raise bad("'prompt' must be a string or a list of token ids", "prompt", "invalid_type")
    if not ids:
        raise bad("the prompt is empty", "prompt", "invalid_value")
    return ids, text


def chat_messages(msgs: Any) -> list[dict]:
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' must be a non-empty list", "messages", "invalid_type")
    clean = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a 'role'", "messages", "invalid_type")
        content = m.get("content", "")
        if content is None:
            content = ""
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad(f"messages[{i}].content: only text parts are supported", "messages", "unsupported")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise bad(f"messages[{i}].content must be a string", "messages", "invalid_type")
        if m["role"] not in ("system", "user", "assistant", "developer", "tool"):
            raise bad(f"messages[{i}].role {m['role']!r} is not a known role", "messages", "invalid_value")
        refuse_in_message(i, m)
        check_text(content, "messages")
        clean.append({"role": m["role"], "content": content, **_name(i, m.get("name")), **_calls(i, m)})
    return clean


def _calls(i: int, m: dict) -> dict:
    """An assistant message's earlier `tool_calls` (their arguments as objects, as chat templates
    read them) and a tool message's `tool_call_id`, where given."""
    out: dict = {}
    if m.get("tool_call_id") is not None:
        if not isinstance(m["tool_call_id"], str):
            raise bad(f"messages[{i}].tool_call_id must be a string", "messages", "invalid_type")
        out["tool_call_id"] = m["tool_call_id"]
    calls = m.get("tool_calls")
    if not calls:
        return out
    if m["role"] != "assistant" or not isinstance(calls, list):
        raise bad(f"messages[{i}].tool_calls must be a list, on an assistant message", "messages", "invalid_type")
    out["tool_calls"] = []
    for c in calls:
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(f.get("arguments"), str):
            raise bad(f"messages[{i}].tool_calls: each must be a function call with a name and arguments (a "
                      "JSON text)", "messages", "invalid_type")
        try:
            args = json.loads(f["arguments"])
        except ValueError:
            raise bad(f"messages[{i}].tool_calls: arguments must be JSON text", "messages", "invalid_value") from None
        out["tool_calls"].append({"id": c.get("id"), "type": "function",
                                  "function": {"name": f["name"], "arguments": args}})
    return out


def _name(i: int, name: Any) -> dict:
    """A message's `name`, as transformers passes it to a chat template: {"name": ...} where given
    (the default template shows none)."""
    if name is None:
        return {}
    if not isinstance(name, str) or len(name) > 256:
        raise bad(f"messages[{i}].name must be a string of at most 256 characters", "messages", "invalid_type")
    return {"name": name}


def chat_ids(m: ChatCompletionRequest | TokenizeChatRequest, info: ModelInfo) -> list[int]:
    """The token ids of checked chat messages: the chat template, then the tokenizer (special
    tokens by default only with the default template, whose text has no BOS of its own)."""
    tools = [t.model_dump(exclude_none=True) for t in m.tools] if m.tools else None
    text = render_chat(chat_messages(m.messages), info, m.add_generation_prompt, tools)
    special = info.chat_template is None if m.add_special_tokens is None else m.add_special_tokens
    return encode_text(text, info, "messages", add_special_tokens=special)
