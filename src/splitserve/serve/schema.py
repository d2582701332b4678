"""The OpenAI request bodies as typed models, and their checks: nothing reaches a worker that has
not been checked here for type, range and size.

`prepare(raw, chat, info, limits)` turns the raw body of `POST /v1/completions` (chat False) or
`POST /v1/chat/completions` (chat True) into a `GenRequest`: token ids, the sampling parameters
as the workers take them, and what the front end needs to answer (stream, stop strings, echo).
Every failure is an `ApiError` with an OpenAI error body (400, or 404 for an unknown model).

Types are strict (an integer field takes no `true` and no `"5"`; a number field takes an integer),
ranges are those of the OpenAI API or, for vLLM's extensions, of vLLM. Fields splitserve does not
implement (`n` > 1, `best_of`, `logprobs`, `suffix`, tools, JSON output, ...) are refused with
400 `unsupported` when they ask for anything but the default, never accepted and ignored.
Unknown fields are ignored, as vLLM does, so that clients sending vendor extras still work.

Sizes are bounded before any work that grows with them (RequestLimits): the body (checked by
api.py before it is read), the prompt's characters before tokenizing (at most `max_model_len`
times the longest token of the vocabulary: a longer text cannot fit the context), the number and
length of stop strings, stop token ids and logit-bias entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .config import RequestLimits
from .messages import WireParams
from .openai_io import ApiError, ModelInfo, bad, parse_json, render_chat


_FINITE = {"allow_inf_nan": False}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


class Sampling(BaseModel):
    """Fields common to both endpoints (sampling, stopping, streaming)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    model: str | None = None
    temperature: float = Field(1.0, ge=0, le=2, **_FINITE)      # 1: the OpenAI default
    top_p: float = Field(1.0, gt=0, le=1, **_FINITE)
    top_k: int = Field(0, ge=-1)                                # vLLM: -1 or 0 off; >= vocab off
    seed: int | None = Field(None, ge=-(2 ** 63), le=2 ** 63 - 1)
    presence_penalty: float = Field(0.0, ge=-2, le=2, **_FINITE)
    frequency_penalty: float = Field(0.0, ge=-2, le=2, **_FINITE)
    repetition_penalty: float = Field(1.0, gt=0, le=2, **_FINITE)  # vLLM's extension
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1)
    user: str | None = None


class Completion(Sampling):
    prompt: Any = None                                          # checked by prompt_ids (clearer errors)
    max_tokens: int | None = Field(None, ge=1)
    echo: bool = False


class Chat(Sampling):
    messages: Any = None                                        # checked by chat_messages
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)


# field -> the values that ask for nothing (anything else: 400 unsupported)
_UNSUPPORTED = {
    "best_of": (None, 1), "logprobs": (None, False, 0), "top_logprobs": (None, 0), "suffix": (None, ""),
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}), "min_p": (None, 0, 0.0), "min_tokens": (None, 0),
    "prompt_logprobs": (None, 0), "use_beam_search": (None, False), "guided_json": (None,),
    "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,),
    "include_stop_str_in_output": (None, False), "skip_special_tokens": (None, True),
    "allowed_token_ids": (None,), "bad_words": (None, []), "truncate_prompt_tokens": (None,),
    "audio": (None,), "modalities": (None, ["text"]), "prediction": (None,),
}

_TYPE_ERRORS = ("type", "parsing", "missing")


def _validation_error(e: ValidationError) -> ApiError:
    err = e.errors(include_url=False)[0]
    loc = [str(x) for x in err["loc"]]
    param = loc[0] if loc else None
    where = ".".join(loc) or "body"
    kind = err["type"]
    if kind == "missing":
        return bad(f"'{where}' is required", param, "missing_field")
    code = "invalid_type" if kind.endswith(_TYPE_ERRORS) or kind in ("model_type", "dict_type", "list_type") \
        else "invalid_value"
    value = err.get("input")
    shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return bad(f"'{where}': {err['msg']} (got {shown})", param, code)


def _check_text(s: str, param: str) -> None:
    """Text must be valid Unicode: a lone surrogate (JSON "\\ud800") cannot be tokenized."""
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise bad(f"'{param}' contains an unpaired UTF-16 surrogate; send valid Unicode text",
                      param, "invalid_value") from None


# ---- the prompt ----------------------------------------------------------------------------------
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
    _check_text(text, param)
    if len(text) > info.max_prompt_chars:
        raise bad(f"the prompt has {len(text)} characters, more than the model's context of "
                  f"{info.max_model_len} tokens can hold (at most {info.max_prompt_chars})", param,
                  "context_length_exceeded")
    return info.tokenizer.encode(text, add_special_tokens=add_special_tokens)


def prompt_ids(p: Any, info: ModelInfo) -> tuple[list[int], str | None]:
    """The prompt as token ids (a string, a list of ids, or a one-element list of either), and its
    text when it came as text."""
    if p is None:
        raise bad("'prompt' is required", "prompt", "missing_field")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        ids, text = encode_text(p, info, "prompt"), p
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
        _check_text(content, "messages")
        clean.append({"role": m["role"], "content": content})
    return clean


# ---- everything else -------------------------------------------------------------------------------
@dataclass(slots=True)
class GenRequest:
    prompt_ids: list[int]
    params: WireParams             # the workers' sampling parameters
    stream: bool
    include_usage: bool
    stop: list[str]                # stop strings, cut by the front end's Detokenizer
    echo_text: str | None = None   # completions with echo: the prompt's text, sent before the output


def _stop_strings(stop: str | list[str] | None, info: ModelInfo, limits: RequestLimits) -> list[str]:
    items = [stop] if isinstance(stop, str) else list(stop or [])
    if len(items) > limits.max_stop_strings:
        raise bad(f"'stop' has {len(items)} strings; at most {limits.max_stop_strings} are allowed", "stop",
                  "invalid_value")
    for s in items:
        if len(s) > limits.max_stop_chars:
            raise bad(f"a stop string has {len(s)} characters; at most {limits.max_stop_chars} are allowed",
                      "stop", "invalid_value")
        _check_text(s, "stop")
    items = [s for s in items if s]
    if items and info.tokenizer is None:
        raise bad("stop strings need a tokenizer", "stop")
    return items


def _token_list(ids: list[int], info: ModelInfo, limits: RequestLimits, param: str) -> list[int]:
    if len(ids) > limits.max_token_list:
        raise bad(f"'{param}' has {len(ids)} entries; at most {limits.max_token_list} are allowed", param,
                  "invalid_value")
    for t in ids:
        if not 0 <= t < info.vocab_size:
            raise bad(f"'{param}': token id {t} is outside the vocabulary (0..{info.vocab_size - 1})", param,
                      "invalid_value")
    return ids


def _logit_bias(bias: dict[str, float], info: ModelInfo, limits: RequestLimits) -> list[tuple[int, float]]:
    ids = []
    for k in bias:
        try:
            ids.append(int(k))
        except ValueError:
            raise bad(f"'logit_bias' keys must be token ids, got {k[:40]!r}", "logit_bias", "invalid_type") from None
    _token_list(ids, info, limits, "logit_bias")
    out = []
    for t, v in zip(ids, bias.values()):
        if not -100 <= v <= 100:
            raise bad(f"'logit_bias' values must be in [-100, 100], got {v}", "logit_bias", "invalid_value")
        out.append((t, float(v)))
    return sorted(out)


def _max_tokens(m: Completion | Chat, chat: bool, n_prompt: int, info: ModelInfo) -> int:
    if n_prompt >= info.max_model_len:
        raise bad(f"the prompt has {n_prompt} tokens but the model's context is {info.max_model_len} tokens",
                  "prompt", "context_length_exceeded")
    room = info.max_model_len - n_prompt
    name, mt = "max_tokens", m.max_tokens
    if chat and m.max_completion_tokens is not None:
        name, mt = "max_completion_tokens", m.max_completion_tokens
    if mt is None:
        return room if chat else min(16, room)  # OpenAI: 16 for completions; chat: all that fits
    if mt > room:
        raise bad(f"'{name}' is {mt} but the prompt ({n_prompt} tokens) leaves room for {room} tokens "
                  f"in the model's context of {info.max_model_len}", name, "context_length_exceeded")
    return mt


def check_model(name: str | None, info: ModelInfo) -> None:
    if name is not None and name != info.name:
        raise ApiError(404, f"the model '{name}' does not exist; this server serves '{info.name}'",
                       "invalid_request_error", "model", "model_not_found")


def prepare(raw: bytes, chat: bool, info: ModelInfo, limits: RequestLimits) -> GenRequest:
    """The checked request of one raw body (see the module docstring); ApiError otherwise."""
    body = parse_json(raw)
    try:
        m = (Chat if chat else Completion).model_validate(body)
    except ValidationError as e:
        raise _validation_error(e) from None
    check_model(m.model, info)
    for name, ok in _UNSUPPORTED.items():
        if body.get(name) not in ok:
            raise bad(f"'{name}' is not supported by this server", name, "unsupported")
    if m.n != 1:
        raise bad("only n=1 is supported", "n", "unsupported")
    stop = _stop_strings(m.stop, info, limits)
    echo_text = None
    if chat:
        if body.get("echo"):
            raise bad("'echo' is not supported for chat completions", "echo", "unsupported")
        text = render_chat(chat_messages(m.messages), info)
        ids = encode_text(text, info, "messages", add_special_tokens=info.chat_template is None)
    else:
        ids, text = prompt_ids(m.prompt, info)
        if m.echo:
            echo_text = text if text is not None else (info.tokenizer.decode(ids) if info.tokenizer else "")
    params = WireParams(max_tokens=_max_tokens(m, chat, len(ids), info), temperature=m.temperature, top_p=m.top_p,
                        top_k=m.top_k if 0 < m.top_k < info.vocab_size else 0,  # -1, 0 and >= vocab: off
                        ignore_eos=m.ignore_eos,
                        stop_token_ids=_token_list(m.stop_token_ids or [], info, limits, "stop_token_ids"),
                        seed=m.seed, presence_penalty=m.presence_penalty, frequency_penalty=m.frequency_penalty,
                        repetition_penalty=m.repetition_penalty,
                        logit_bias=_logit_bias(m.logit_bias, info, limits) if m.logit_bias else [])
    so = m.stream_options or StreamOptions()
    return GenRequest(ids, params, m.stream, so.include_usage, stop, echo_text)
