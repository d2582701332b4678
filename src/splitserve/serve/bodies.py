"""The OpenAI request and response bodies as typed models (pydantic, strict: an integer field
takes no `true` and no `"5"`; a number field takes an integer), ranges those of the OpenAI API or,
for vLLM's extensions, of vLLM; and `validate`, which turns pydantic's first complaint into an
OpenAI error body (400) naming the field. api.py builds the OpenAPI schema from these models;
schema.py checks a body with them."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

from .openai_io import ApiError, bad

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
    continuous_usage_stats: bool = Field(default=False, description="vLLM's: usage so far in every chunk "
                                                                    "(with include_usage)")


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)
    name: str = ""
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema", description="the JSON schema of the output")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format: the output as free text, any JSON object, or JSON following a schema."""

    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class Described(BaseModel):
    """The OpenAI fields that describe a request without changing its output: accepted, checked
    for type, and used where they mean something here (`user` in the request's log line,
    `prompt_cache_key` as a routing hint: policy/prefix_routing.py CacheKeys)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    user: str | None = Field(None, max_length=256, description="the end user, for the log")
    safety_identifier: str | None = Field(None, max_length=256)
    metadata: dict[str, str] | None = Field(None, max_length=16, description="up to 16 string pairs, kept with "
                                                                               "nothing")
    store: bool | None = Field(None, description="accepted; nothing is stored")
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    prompt_cache_key: str | None = Field(None, max_length=256, description="a routing hint: with prefix-aware "
                                         "routing, requests of one key go to one prompt worker while its load allows")
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = Field(
        None, description="accepted; the model does not reason")


class Sampling(Described):
    """Fields common to both endpoints (sampling, stopping, streaming)."""

    model: str | None = None
    temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False)  # 1: the OpenAI default
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(0, ge=-1)                                # vLLM: -1 or 0 off; >= vocab off
    seed: int | None = Field(None, ge=-(2 ** 63), le=2 ** 63 - 1)
    presence_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: float = Field(1.0, gt=0, le=2, allow_inf_nan=False)  # vLLM's extension
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=16, description="choices, each sampled on its own (seed + i)")
    best_of: int | None = Field(None, ge=1, le=16, description="sample this many (>= n), answer the n of "
                                                               "highest cumulative logprob; not with stream")
    prompt_logprobs: int | None = Field(None, ge=0, le=20, description="vLLM's: each prompt token's logprob and "
                                                                       "the N most likely there")
    response_format: ResponseFormat | None = None
    # vLLM's sampling extensions
    min_p: float = Field(0.0, ge=0, le=1, allow_inf_nan=False, description="vLLM's: sample among the tokens "
                         "of at least min_p x the most likely one's probability")
    min_tokens: int = Field(0, ge=0, description="vLLM's: no EOS, stop token or stop string before this many tokens")
    include_stop_str_in_output: bool = Field(False, description="vLLM's: the text ends after the stop string, "
                                                                "not before it")
    skip_special_tokens: bool = Field(True, description="vLLM's: leave special tokens out of the text")
    guided_json: dict[str, Any] | str | None = Field(None, description="vLLM's: a JSON schema the output follows")
    guided_regex: str | None = Field(None, description="vLLM's: a regular expression the output matches")
    guided_choice: list[str] | None = Field(None, description="vLLM's: the output is one of these strings")
    guided_grammar: str | None = Field(None, description="vLLM's: a Lark grammar the output follows "
                                                         "(llguidance's dialect)")


class CompletionRequest(Sampling):
    """The body of POST /v1/completions."""

    prompt: Prompt = None
    max_tokens: int | None = Field(None, ge=1, description="default 16")
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20, description="each token's logprob and the N most likely "
                                                                "(with echo: the prompt's too)")
    add_special_tokens: bool = Field(True, description="vLLM's: add the tokenizer's special tokens (BOS) to a "
                                                       "text prompt")


class FunctionDef(BaseModel):
    """A function tool: its name, what it does, and the JSON schema of its arguments."""

    model_config = ConfigDict(strict=True, extra="ignore")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    name: str


class NamedToolChoice(BaseModel):
    """tool_choice naming the function to call."""

    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(Sampling):
    """The body of POST /v1/chat/completions."""

    tools: list[Tool] | None = Field(None, max_length=128, description="function tools the model may call "
                                                                       "(serve/tools.py)")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="default: auto with tools, else none; required and a named function force a call")
    parallel_tool_calls: bool = True

    messages: Messages = None
    max_tokens: int | None = Field(None, ge=1, description="default: all that fits the context")
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20, description="with logprobs: the N most likely tokens")
    add_generation_prompt: bool = Field(True, description="vLLM's: end the prompt with the assistant's turn")
    add_special_tokens: bool | None = Field(None, description="vLLM's: add the tokenizer's special tokens; "
                                                              "default: only with the default chat template")


class ResponsesRequest(Described):
    """The body of POST /v1/responses (OpenAI's Responses API; serve/openai_responses.py runs it
    as a chat completion). `input`, `tools`, `tool_choice` and `text` are checked there, item by
    item."""

    model: str | None = None
    input: Any = Field(None, description="a text, or a list of message, function_call and function_call_output "
                                         "items")
    instructions: str | None = Field(None, description="the system message (not carried by previous_response_id)")
    previous_response_id: str | None = Field(None, description="continue a response kept in memory")
    tools: list[dict[str, Any]] | None = Field(None, max_length=128, description="function tools")
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    stream: bool = False
    text: dict[str, Any] | None = Field(None, description="{format: text, json_object or json_schema}")
    reasoning: dict[str, Any] | None = Field(None, description="accepted; the model does not reason")


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
    tools: list[Tool] | None = Field(None, max_length=128, description="rendered by the chat template")
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


M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], body: dict) -> M:
    """The body checked by `model`; ApiError (400) naming the first field at fault otherwise."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise _validation_error(e) from None
