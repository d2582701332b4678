"""The OpenAI request bodies as typed models, and their checks: nothing reaches a worker that has
not been checked here for type, range and size.

`prepare(raw, chat, info, limits)` turns the raw body of `POST /v1/completions` (chat False) or
`POST /v1/chat/completions` (chat True) into a `GenRequest`: token ids, the sampling parameters
as the workers take them, and what the front end needs to answer (stream, stop strings, echo).
`tokenize(raw, info)` and `detokenize(raw, info)` answer vLLM's `POST /tokenize` and
`POST /detokenize` (a prompt or chat messages -> token ids, count and context; token ids -> text).
Every failure is an `ApiError` with an OpenAI error body (400, or 404 for an unknown model).

Types are strict (an integer field takes no `true` and no `"5"`; a number field takes an integer),
ranges are those of the OpenAI API or, for vLLM's extensions, of vLLM. Every field of the OpenAI
API (as the official `openai` client sends it) and of vLLM's extensions that splitserve does not
implement (`n` > 1, `best_of`, `logprobs`, `suffix`, tools, JSON output, `user`, `store`, ...; the
table UNSUPPORTED) is refused with 400 `unsupported`, naming the field, when it asks for anything
but the default, never accepted and ignored; so are the keys of a chat message other than `role`
and `content` (`name`, `tool_calls`, ...) and OpenAI's `stream_options.include_obfuscation`. Names
that are neither OpenAI's nor vLLM's are ignored, as vLLM does, so that clients sending vendor
extras still work.

Sizes are bounded before any work that grows with them (RequestLimits): the body (checked by
api.py before it is read), the prompt's characters before tokenizing (at most `max_model_len`
times the longest token of the vocabulary: a longer text cannot fit the context), the number and
length of stop strings, stop token ids and logit-bias entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

from .config import RequestLimits
from .messages import WireParams
from .openai_io import ApiError, ModelInfo, bad, parse_json, render_chat


_FINITE = {"allow_inf_nan": False}
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_MESSAGES = {"type": "array", "minItems": 1, "items": {
    "type": "object", "required": ["role"],
    "properties": {"role": {"enum": ["system", "user", "assistant", "developer", "tool"]},
                   "content": {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": {
                       "type": "object", "required": ["type", "text"],
                       "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}]}}}}
# checked by prompt_ids and chat_messages (clearer errors than a union type's); documented as typed
Prompt = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "string"}, _IDS, {"type": "array", "minItems": 1,
                                                                           "maxItems": 1, "items": {
                                                                               "anyOf": [{"type": "string"}, _IDS]}}],
                                        "description": "one prompt: text, or token ids"})]
Messages = Annotated[Any, WithJsonSchema({**_MESSAGES, "description": "chat messages (text content only)"})]


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False
    continuous_usage_stats: bool = Field(False, description="vLLM's: usage so far in every chunk (with "
                                                            "include_usage)")


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
    n: int = Field(1, ge=1, description="only 1 is supported")


class CompletionRequest(Sampling):
    """The body of POST /v1/completions."""

    prompt: Prompt = None
    max_tokens: int | None = Field(None, ge=1, description="default 16")
    echo: bool = False
    add_special_tokens: bool = Field(True, description="vLLM's: add the tokenizer's special tokens (BOS) to a "
                                                       "text prompt")


class ChatCompletionRequest(Sampling):
    """The body of POST /v1/chat/completions."""

    messages: Messages = None
    max_tokens: int | None = Field(None, ge=1, description="default: all that fits the context")
    max_completion_tokens: int | None = Field(None, ge=1)
    add_generation_prompt: bool = Field(True, description="vLLM's: end the prompt with the assistant's turn")
    add_special_tokens: bool | None = Field(None, description="vLLM's: add the tokenizer's special tokens; "
                                                              "default: only with the default chat template")


class TokenizeCompletionRequest(BaseModel):
    """vLLM's POST /tokenize with a prompt."""

    model_config = ConfigDict(strict=True, extra="ignore")
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(BaseModel):
    """vLLM's POST /tokenize with chat messages: the token ids /v1/chat/completions would run."""

    model_config = ConfigDict(strict=True, extra="ignore")
    model: str | None = None
    messages: Messages
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = Field(None, description="default: only with the default chat template")
    return_token_strs: bool | None = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    """vLLM's POST /detokenize."""

    model_config = ConfigDict(strict=True, extra="ignore")
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


# field -> the values that ask for nothing (anything else: 400 unsupported). The OpenAI API's
# fields (those of the `openai` client's create params that no model above has) and vLLM's
# extensions (its CompletionRequest, ChatCompletionRequest and TokenizeChatRequest); `echo` on
# chat is refused in prepare (vLLM's chat echo means something else).
UNSUPPORTED = {
    # OpenAI
    "best_of": (None, 1), "logprobs": (None, False, 0), "top_logprobs": (None, 0), "suffix": (None, ""),
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "parallel_tool_calls": (None, True), "response_format": (None, {"type": "text"}), "audio": (None,),
    "modalities": (None, ["text"]), "prediction": (None,), "user": (None,), "safety_identifier": (None,),
    "metadata": (None, {}), "store": (None, False), "service_tier": (None, "auto", "default"),
    "reasoning_effort": (None,), "verbosity": (None,), "web_search_options": (None,), "moderation": (None,),
    "prompt_cache_key": (None,), "prompt_cache_retention": (None,), "prompt_cache_options": (None,),
    # vLLM's extensions
    "min_p": (None, 0, 0.0), "min_tokens": (None, 0), "prompt_logprobs": (None, 0), "use_beam_search": (None, False),
    "length_penalty": (None, 1.0), "guided_json": (None,), "guided_regex": (None,), "guided_choice": (None,),
    "guided_grammar": (None,), "guided_decoding_backend": (None,), "guided_whitespace_pattern": (None,),
    "structured_outputs": (None,), "structural_tag": (None,), "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True), "spaces_between_special_tokens": (None, True),
    "allowed_token_ids": (None,), "bad_words": (None, []), "truncate_prompt_tokens": (None,),
    "prompt_embeds": (None,), "priority": (None, 0), "request_id": (None,), "logits_processors": (None, []),
    "return_tokens_as_token_ids": (None, False), "return_token_ids": (None, False), "cache_salt": (None,),
    "kv_transfer_params": (None,), "vllm_xargs": (None, {}), "max_repetition_pattern_size": (None, 0),
    "min_repetition_pattern_size": (None, 0), "repetition_min_count": (None, 0), "include_reasoning": (None, True),
    "continue_final_message": (None, False), "documents": (None,), "chat_template": (None,),
    "chat_template_kwargs": (None, {}), "mm_processor_kwargs": (None,), "media_io_kwargs": (None,),
}
_STREAM_OPTIONS_UNSUPPORTED = {"include_obfuscation": (None, False)}
_MESSAGE_UNSUPPORTED = {"name": (None,), "tool_calls": (None, []), "tool_call_id": (None,),
                        "function_call": (None,), "audio": (None,), "refusal": (None,)}


def _refuse_unsupported(body: dict) -> None:
    for name, ok in UNSUPPORTED.items():
        if body.get(name) not in ok:
            raise bad(f"'{name}' is not supported by this server", name, "unsupported")
    so = body.get("stream_options")
    if isinstance(so, dict):
        for name, ok in _STREAM_OPTIONS_UNSUPPORTED.items():
            if so.get(name) not in ok:
                raise bad(f"'stream_options.{name}' is not supported by this server", f"stream_options.{name}",
                          "unsupported")


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
        for key, ok in _MESSAGE_UNSUPPORTED.items():
            if m.get(key) not in ok:
                raise bad(f"messages[{i}].{key} is not supported by this server", f"messages.{key}",
                          "unsupported")
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
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats: usage in every chunk


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


def _max_tokens(m: CompletionRequest | ChatCompletionRequest, chat: bool, n_prompt: int, info: ModelInfo) -> int:
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
    m = _validate(ChatCompletionRequest if chat else CompletionRequest, body)
    check_model(m.model, info)
    _refuse_unsupported(body)
    if m.n != 1:
        raise bad("only n=1 is supported", "n", "unsupported")
    stop = _stop_strings(m.stop, info, limits)
    echo_text = None
    if chat:
        if body.get("echo"):
            raise bad("'echo' is not supported for chat completions", "echo", "unsupported")
        ids = _chat_ids(m, info)
    else:
        ids, text = prompt_ids(m.prompt, info, m.add_special_tokens)
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
    return GenRequest(ids, params, m.stream, so.include_usage, stop, echo_text,
                      so.include_usage and so.continuous_usage_stats)


def _validate(model: type[BaseModel], body: dict):
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise _validation_error(e) from None


def _chat_ids(m: ChatCompletionRequest | TokenizeChatRequest, info: ModelInfo) -> list[int]:
    """The token ids of checked chat messages: the chat template, then the tokenizer (special
    tokens by default only with the default template, whose text has no BOS of its own)."""
    text = render_chat(chat_messages(m.messages), info, m.add_generation_prompt)
    special = info.chat_template is None if m.add_special_tokens is None else m.add_special_tokens
    return encode_text(text, info, "messages", add_special_tokens=special)


def tokenize(raw: bytes, info: ModelInfo) -> dict:
    """vLLM's POST /tokenize: a body with `messages` is a chat (the ids /v1/chat/completions runs),
    else a `prompt` text (the ids /v1/completions runs). The text bound of `encode_text` holds here
    too (ASSUMED: vLLM tokenizes any length; a text refused here could never be served)."""
    body = parse_json(raw)
    chat = "messages" in body
    m = _validate(TokenizeChatRequest if chat else TokenizeCompletionRequest, body)
    check_model(m.model, info)
    _refuse_unsupported(body)
    ids = _chat_ids(m, info) if chat else encode_text(m.prompt, info, "prompt", m.add_special_tokens)
    strs = [info.tokenizer.tk.id_to_token(t) for t in ids] if m.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=info.max_model_len, tokens=ids,
                            token_strs=strs).model_dump()


def detokenize(raw: bytes, info: ModelInfo) -> dict:
    """vLLM's POST /detokenize: token ids -> text, special tokens kept (ASSUMED: vLLM decodes with
    the tokenizer's default, which for Hugging Face tokenizers keeps them), so that tokenizing the
    text without adding special tokens gives the ids back."""
    body = parse_json(raw)
    m = _validate(DetokenizeRequest, body)
    check_model(m.model, info)
    if info.tokenizer is None:
        raise bad("this model has no tokenizer", "tokens")
    for t in m.tokens:
        if not 0 <= t < info.vocab_size:
            raise bad(f"token id {t} is outside the vocabulary (0..{info.vocab_size - 1})", "tokens",
                      "invalid_value")
    return DetokenizeResponse(prompt=info.tokenizer.decode(m.tokens, skip_special_tokens=False)).model_dump()
