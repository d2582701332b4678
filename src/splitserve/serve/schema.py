"""The checks of an OpenAI request body: nothing reaches a worker that has not been checked for
type, range and size.

`prepare(raw, chat, info, limits)` turns the raw body of `POST /v1/completions` (chat False) or
`POST /v1/chat/completions` (chat True) into a `GenRequest`: token ids, the sampling parameters
as the workers take them, and what the front end needs to answer (stream, stop strings, echo).
`tokenize(raw, info)` and `detokenize(raw, info)` answer vLLM's `POST /tokenize` and
`POST /detokenize` (a prompt or chat messages -> token ids, count and context; token ids -> text).
Every failure is an `ApiError` with an OpenAI error body (400, or 404 for an unknown model).

A body is checked by its typed model first (bodies.py: types strict, ranges those of the OpenAI
API or of vLLM), then for what is not implemented (refusals.py: refused by name, never accepted and
ignored), then its prompt (prompts.py), then here its limits and sampling parameters.

Sizes are bounded before any work that grows with them (RequestLimits): the body (checked by
api.py before it is read), the prompt's characters before tokenizing (at most `max_model_len`
times the longest token of the vocabulary: a longer text cannot fit the context), the number and
length of stop strings, stop token ids and logit-bias entries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .bodies import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, DetokenizeResponse, ResponseFormat,
                     Sampling, StreamOptions, TokenizeChatRequest, TokenizeCompletionRequest, TokenizeResponse, validate)
from ..policy.prefix_routing import cache_key
from .config import RequestLimits
from .messages import WireParams
from .openai_io import ApiError, ModelInfo, bad, dumps, parse_json
from .prompts import chat_ids, check_text, encode_text, prompt_ids
from .refusals import refuse_tools, refuse_unsupported
from .tools import ToolPlan
from .tools import grammar as tool_grammar

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # its typed dict (llguidance does not export it)


@dataclass(slots=True)
class GenRequest:
    prompt_ids: list[int]
    params: WireParams             # the workers' sampling parameters
    stream: bool
    include_usage: bool
    stop: list[str]                # stop strings, cut by the front end's Detokenizer
    echo_text: str | None = None   # completions with echo: the prompt's text, sent before the output
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats: usage in every chunk
    logprobs: int | None = None     # completions' logprobs N, chat's top_logprobs N (logprobs: true); None: off
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs N, as asked (echo's come through params)
    n: int = 1                      # choices answered
    best_of: int | None = None      # children sampled (> n: the n best answered), None: n
    include_stop: bool = False      # vLLM's include_stop_str_in_output: the text ends after the stop string
    skip_special: bool = True       # vLLM's skip_special_tokens: special tokens left out of the text
    user: str | None = None         # OpenAI's `user`: in the request's log line
    tools: ToolPlan | None = None   # chat's tools: the calls parsed out of the output (tools.py)
    cache_key: int = -1             # OpenAI's prompt_cache_key, hashed (policy/prefix_routing.py); -1: none


def _stop_strings(stop: str | list[str] | None, info: ModelInfo, limits: RequestLimits) -> list[str]:
    items = [stop] if isinstance(stop, str) else list(stop or [])
    if len(items) > limits.max_stop_strings:
        raise bad(f"'stop' has {len(items)} strings; at most {limits.max_stop_strings} are allowed", "stop",
                  "invalid_value")
    for s in items:
        if len(s) > limits.max_stop_chars:
            raise bad(f"a stop string has {len(s)} characters; at most {limits.max_stop_chars} are allowed",
                      "stop", "invalid_value")
        check_text(s, "stop")
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


def _max_tokens(m: CompletionRequest | ChatCompletionRequest, n_prompt: int, info: ModelInfo) -> int:
    if n_prompt >= info.max_model_len:
        raise bad(f"the prompt has {n_prompt} tokens but the model's context is {info.max_model_len} tokens",
                  "prompt", "context_length_exceeded")
    room = info.max_model_len - n_prompt
    chat = isinstance(m, ChatCompletionRequest)
    name, mt = "max_tokens", m.max_tokens
    if isinstance(m, ChatCompletionRequest) and m.max_completion_tokens is not None:
        name, mt = "max_completion_tokens", m.max_completion_tokens
    if mt is None:
        return room if chat else min(16, room)  # OpenAI: 16 for completions; chat: all that fits
    if mt > room:
        raise bad(f"'{name}' is {mt} but the prompt ({n_prompt} tokens) leaves room for {room} tokens "
                  f"in the model's context of {info.max_model_len}", name, "context_length_exceeded")
    return mt


def _logprobs(m: CompletionRequest | ChatCompletionRequest, info: ModelInfo) -> tuple[int | None, int | None]:
    """(logprobs N for the output, the prompt's N for the engine): completions' `logprobs` with
    `echo` scores the prompt too (as vLLM); chat's `top_logprobs` needs `logprobs: true`."""
    n: int | None
    if isinstance(m, ChatCompletionRequest):
        if m.top_logprobs and not m.logprobs:
            raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value")
        n = (m.top_logprobs or 0) if m.logprobs else None
        prompt_n = m.prompt_logprobs
    else:
        n, prompt_n = m.logprobs, m.prompt_logprobs
        if m.echo and n is not None:
            prompt_n = max(prompt_n or 0, n)
    if (n is not None or prompt_n is not None) and not info.scores:
        raise bad("logprobs need workers that run the model (--worker-mode engine)", "logprobs", "unsupported")
    return n, prompt_n


# JSON output without whitespace between its tokens (llguidance allows any by default): a model
# cannot stall on whitespace, as small ones do
COMPACT_JSON: JsonCompileOptions = {"whitespace_flexible": False}


GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")  # vLLM's; each a grammar


def _grammar(m: Sampling, info: ModelInfo, limits: RequestLimits, plan: ToolPlan | None = None) -> str | None:
    """The llguidance grammar the output follows (engine/structured.py): of `response_format`, of
    one of vLLM's guided_json / guided_regex / guided_choice / guided_grammar, or of a tool call
    that `tool_choice` forces (tools.grammar); None for free text. Checked here, so that a grammar
    the workers cannot follow is refused before it reaches them."""
    asked = [name for name in GUIDED if getattr(m, name) is not None]
    if m.response_format is not None and m.response_format.type != "text":
        asked.insert(0, "response_format")
    if plan is not None and plan.forced:
        asked.insert(0, "tool_choice")
    if not asked:
        return None
    if len(asked) > 1:
        raise bad(f"only one of {', '.join(asked)} may be given", asked[1], "invalid_value")
    name = asked[0]
    if not info.scores:
        raise bad(f"{name} needs workers that run the model (--worker-mode engine)", name, "unsupported")
    import llguidance

    try:
        if name == "guided_regex":
            grammar = llguidance.LLMatcher.grammar_from_regex(_sized(m.guided_regex, limits, name))
        elif name == "guided_choice":
            grammar = llguidance.LLMatcher.grammar_from_lark(_choices(m.guided_choice, limits))
        elif name == "guided_grammar":
            grammar = llguidance.LLMatcher.grammar_from_lark(_sized(m.guided_grammar, limits, name))
        elif name == "tool_choice":
            assert plan is not None, "asked for: a plan"
            grammar = llguidance.LLMatcher.grammar_from_lark(_sized(tool_grammar(plan), limits, name))
        else:
            schema = closed(_schema(m.response_format) if name == "response_format" else _json_schema(m.guided_json))
            _sized(dumps(schema).decode(), limits, name)
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=COMPACT_JSON)
        error = llguidance.LLMatcher.validate_grammar(grammar)
    except (ValueError, TypeError) as e:
        error = str(e)
    if error:
        raise bad(f"{name} cannot be followed: {error[:300]}", name, "invalid_value")
    return _sized(grammar, limits, name)


_NAMED_SCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema


def closed(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on each object schema that lists its properties
    and says nothing of others, as vLLM's default grammar backend (xgrammar's strict mode) and
    OpenAI's strict mode read such a schema: otherwise a model may add keys until max_tokens."""
    if isinstance(schema, list):
        return [closed(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k in _NAMED_SCHEMAS and isinstance(v, dict):
            out[k] = {name: closed(x) for name, x in v.items()}
        else:
            out[k] = v if k in ("enum", "const", "default", "examples") else closed(v)
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def _sized(text: str | None, limits: RequestLimits, name: str) -> str:
    """`text` (a schema, regex or grammar), refused where longer than the limit."""
    assert text is not None, "asked for: not None"
    if len(text) > limits.max_schema_bytes:
        raise bad(f"{name} makes a grammar of {len(text)} bytes; at most {limits.max_schema_bytes} are allowed",
                  name, "invalid_value")
    return text


def _schema(rf: ResponseFormat | None) -> dict:
    """The JSON schema of `response_format` (json_object: any object)."""
    assert rf is not None, "asked for: not None"
    if rf.type == "json_object":
        return {"type": "object"}
    if rf.json_schema is None or rf.json_schema.json_schema is None:
        raise bad("'response_format.json_schema.schema' is required for type json_schema", "response_format",
                  "missing_field")
    return rf.json_schema.json_schema


def _json_schema(v: dict | str | None) -> dict:
    """vLLM's guided_json: a schema, or its JSON text."""
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            raise bad("guided_json must be a JSON schema (an object, or its JSON text)", "guided_json",
                      "invalid_value") from None
    if not isinstance(v, dict):
        raise bad("guided_json must be a JSON schema (an object, or its JSON text)", "guided_json", "invalid_value")
    return v


def _choices(choices: list[str] | None, limits: RequestLimits) -> str:
    """vLLM's guided_choice as a Lark grammar: exactly one of the strings."""
    if not choices or any(not c for c in choices):
        raise bad("guided_choice must be a non-empty list of non-empty strings", "guided_choice", "invalid_value")
    return _sized("start: " + " | ".join(json.dumps(c) for c in choices), limits, "guided_choice")


def tool_plan(m: ChatCompletionRequest) -> ToolPlan | None:
    """What a chat request asked of tools (None: none offered); 400 for a tool_choice without
    tools, or naming a function not among them."""
    choice = m.tool_choice
    if not m.tools:
        if choice is not None and choice != "none":
            raise bad("'tool_choice' needs 'tools'", "tool_choice", "invalid_value")
        return None
    tools = tuple({**f, "parameters": closed(f["parameters"])} if "parameters" in f else f
                  for f in (t.function.model_dump(exclude_none=True) for t in m.tools))
    name = choice if isinstance(choice, str) or choice is None else choice.function.name
    if name not in (None, "none", "auto", "required") and name not in {t["name"] for t in tools}:
        raise bad(f"'tool_choice' names {name!r}, which is not among the tools", "tool_choice", "invalid_value")
    return ToolPlan(tools, name or "auto", m.parallel_tool_calls)


def _min_tokens(n: int, max_tokens: int) -> int:
    """vLLM's min_tokens, at most the request's max_tokens."""
    if n > max_tokens:
        raise bad(f"'min_tokens' ({n}) must be at most max_tokens ({max_tokens})", "min_tokens", "invalid_value")
    return n


def check_model(name: str | None, info: ModelInfo) -> None:
    if name is not None and name != info.name:
        raise ApiError(404, f"the model '{name}' does not exist; this server serves '{info.name}'",
                       "invalid_request_error", "model", "model_not_found")


def prepare(raw: bytes, chat: bool, info: ModelInfo, limits: RequestLimits) -> GenRequest:
    """The checked request of one raw body (see the module docstring); ApiError otherwise."""
    body = parse_json(raw)
    m = validate(ChatCompletionRequest, body) if chat else validate(CompletionRequest, body)
    check_model(m.model, info)
    refuse_unsupported(body)
    if m.best_of is not None and m.best_of < m.n:
        raise bad(f"'best_of' ({m.best_of}) must be at least 'n' ({m.n})", "best_of", "invalid_value")
    if m.stream and m.best_of is not None and m.best_of > m.n:
        raise bad("'best_of' larger than 'n' cannot be streamed", "best_of", "invalid_value")
    if m.best_of is not None and m.best_of > m.n and not info.scores:
        raise bad("'best_of' needs workers that run the model (--worker-mode engine)", "best_of", "unsupported")
    stop = _stop_strings(m.stop, info, limits)
    echo_text, plan = None, None
    if isinstance(m, ChatCompletionRequest):
        plan = tool_plan(m)
        if body.get("echo"):
            raise bad("'echo' is not supported for chat completions", "echo", "unsupported")
        ids = chat_ids(m, info)
    else:
        refuse_tools(body)
        ids, text = prompt_ids(m.prompt, info, m.add_special_tokens)
        if m.echo:
            echo_text = text if text is not None else (info.tokenizer.decode(ids) if info.tokenizer else "")
    n_lp, prompt_lp = _logprobs(m, info)
    max_tokens = _max_tokens(m, len(ids), info)
    params = WireParams(max_tokens=max_tokens, temperature=m.temperature, top_p=m.top_p,
                        top_k=m.top_k if 0 < m.top_k < info.vocab_size else 0,  # -1, 0 and >= vocab: off
                        ignore_eos=m.ignore_eos,
                        stop_token_ids=_token_list(m.stop_token_ids or [], info, limits, "stop_token_ids"),
                        seed=m.seed, presence_penalty=m.presence_penalty, frequency_penalty=m.frequency_penalty,
                        repetition_penalty=m.repetition_penalty,
                        logit_bias=_logit_bias(m.logit_bias, info, limits) if m.logit_bias else [],
                        logprobs=n_lp, prompt_logprobs=prompt_lp, grammar=_grammar(m, info, limits, plan),
                        min_p=m.min_p, min_tokens=_min_tokens(m.min_tokens, max_tokens))
    so = m.stream_options or StreamOptions()
    return GenRequest(ids, params, m.stream, so.include_usage, stop, echo_text,
                      so.include_usage and so.continuous_usage_stats, n_lp, m.prompt_logprobs, m.n,
                      m.best_of if m.best_of is not None and m.best_of > m.n else None,
                      m.include_stop_str_in_output, m.skip_special_tokens, m.user, plan,
                      -1 if m.prompt_cache_key is None else cache_key(m.prompt_cache_key))


def tokenize(raw: bytes, info: ModelInfo) -> dict:
    """vLLM's POST /tokenize: a body with `messages` is a chat (the ids /v1/chat/completions runs),
    else a `prompt` text (the ids /v1/completions runs). The text bound of `encode_text` holds here
    too (ASSUMED: vLLM tokenizes any length; a text refused here could never be served)."""
    body = parse_json(raw)
    chat = "messages" in body
    m = validate(TokenizeChatRequest, body) if chat else validate(TokenizeCompletionRequest, body)
    check_model(m.model, info)
    refuse_unsupported(body)
    if isinstance(m, TokenizeChatRequest):
        ids = chat_ids(m, info)
    else:
        ids = encode_text(m.prompt, info, "prompt", m.add_special_tokens)
    strs = None
    if m.return_token_strs:
        tok = info.tokenizer
        assert tok is not None  # encode_text and chat_ids refuse a model without one
        strs = [tok.tk.id_to_token(t) or "" for t in ids]  # ids of this tokenizer: each has its token
    return TokenizeResponse(count=len(ids), max_model_len=info.max_model_len, tokens=ids,
                            token_strs=strs).model_dump()


def detokenize(raw: bytes, info: ModelInfo) -> dict:
    """vLLM's POST /detokenize: token ids -> text, special tokens kept (ASSUMED: vLLM decodes with
    the tokenizer's default, which for Hugging Face tokenizers keeps them), so that tokenizing the
    text without adding special tokens gives the ids back."""
    body = parse_json(raw)
    m = validate(DetokenizeRequest, body)
    check_model(m.model, info)
    if info.tokenizer is None:
        raise bad("this model has no tokenizer", "tokens")
    for t in m.tokens:
        if not 0 <= t < info.vocab_size:
            raise bad(f"token id {t} is outside the vocabulary (0..{info.vocab_size - 1})", "tokens",
                      "invalid_value")
    return DetokenizeResponse(prompt=info.tokenizer.decode(m.tokens, skip_special_tokens=False)).model_dump()
