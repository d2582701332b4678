"""The OpenAI wire format at the edge: request validation, error bodies, chat prompts, and
incremental detokenization. No HTTP framework here (api.py does the serving).

Errors are `ApiError(status, message, type, param, code)`, rendered as
`{"error": {"message", "type", "param", "code"}}`.

Chat prompts use the tokenizer's own chat template (`chat_template` in the model directory's
tokenizer_config.json, rendered with Jinja2 in a sandbox) when there is one; otherwise the
DEFAULT CHAT TEMPLATE, which renders each message as

    <|role|>\\n{content}\\n

(role = system, user or assistant) and then `<|assistant|>\\n`, tokenized with the tokenizer's
special tokens (BOS for `tiny`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

try:  # the serve extra installs orjson: about 10x faster than json on our request and response bodies
    import orjson
except ImportError:  # pragma: no cover
    orjson = None


def dumps(obj) -> bytes:
    """Compact JSON as bytes. orjson writes non-ASCII characters as UTF-8; json (without orjson, or
    for what orjson refuses: lone surrogates, integers beyond 64 bits) \\u-escapes them."""
    if orjson is not None:
        try:
            return orjson.dumps(obj)
        except TypeError:
            pass
    return json.dumps(obj, separators=(",", ":")).encode()


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


@dataclass
class ModelInfo:
    name: str
    tokenizer: object | None
    vocab_size: int
    max_model_len: int
    chat_template: str | None = None
    bos_token: str = ""
    eos_token: str = ""

    @classmethod
    def load(cls, model: str) -> "ModelInfo":
        from ..engine.config import ModelConfig
        from ..engine.presets import get_preset
        from ..engine.tokenizer import Tokenizer

        p = Path(model)
        if p.is_dir():
            cfg = ModelConfig.from_dir(p)
            tok = Tokenizer.from_dir(p, cfg.eos_token_ids)
            info = cls(model, tok, cfg.vocab_size, cfg.max_position_embeddings)
            tc = p / "tokenizer_config.json"
            if tc.is_file():
                data = json.loads(tc.read_text())
                tmpl = data.get("chat_template")
                if isinstance(tmpl, list):  # named templates: take "default"
                    tmpl = next((t.get("template") for t in tmpl if t.get("name") == "default"), None)
                info.chat_template = tmpl if isinstance(tmpl, str) else None
                info.bos_token = _token_str(data.get("bos_token"))
                info.eos_token = _token_str(data.get("eos_token"))
            return info
        cfg = get_preset(model)
        tok = Tokenizer.tiny() if model.startswith("tiny") else None
        return cls(model, tok, cfg.vocab_size, cfg.max_position_embeddings)


def _token_str(t) -> str:
    if isinstance(t, dict):
        return t.get("content", "")
    return t or ""


# ---- field checks -------------------------------------------------------------------------------
def _int(body: dict, name: str, default, lo=None, hi=None):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(f"'{name}' must be an integer, got {type(v).__name__}", name, "invalid_type")
    if lo is not None and v < lo:
        raise bad(f"'{name}' must be at least {lo}, got {v}", name, "invalid_value")
    if hi is not None and v > hi:
        raise bad(f"'{name}' must be at most {hi}, got {v}", name, "invalid_value")
    return v


def _float(body: dict, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad(f"'{name}' must be a number", name, "invalid_type")
    if v < lo or (lo_open and v == lo) or v > hi:
        raise bad(f"'{name}' must be in {'(' if lo_open else '['}{lo}, {hi}], got {v}", name, "invalid_value")
    return float(v)


def _bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"'{name}' must be a boolean", name, "invalid_type")
    return v


def parse_json(raw: bytes) -> dict:
    body = None
    if orjson is not None:
        try:
            body = orjson.loads(raw)
        except ValueError:
            pass  # json below: it accepts a little more (NaN, UTF-16, huge integers) and words the error
    if body is None:
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise bad(f"the request body is not valid JSON: {e}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_json")
    return body


def check_model(body: dict, info: ModelInfo) -> None:
    m = body.get("model")
    if m is None:
        return
    if not isinstance(m, str):
        raise bad("'model' must be a string", "model", "invalid_type")
    if m != info.name:
        raise ApiError(404, f"the model '{m}' does not exist; this server serves '{info.name}'",
                       "invalid_request_error", "model", "model_not_found")


def prompt_ids(body: dict, info: ModelInfo) -> list[int]:
    """The prompt as token ids: a string, a list of ids, or a one-element list of either."""
    if "prompt" not in body:
        raise bad("'prompt' is required", "prompt", "missing_field")
    p = body["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        if info.tokenizer is None:
            raise bad("this model has no tokenizer; send the prompt as a list of token ids", "prompt")
        ids = info.tokenizer.encode(p)
    elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        ids = list(p)
        bad_id = next((t for t in ids if not 0 <= t < info.vocab_size), None)
        if bad_id is not None:
            raise bad(f"token id {bad_id} is outside the vocabulary (0..{info.vocab_size - 1})", "prompt",
                      "invalid_value")
    elif isinstance(p, list) and len(p) > 1 and all(isinstance(x, (str, list)) for x in p):
        raise bad("only one prompt per request is supported (got a batch)", "prompt", "unsupported")
    else:
        raise bad("'prompt' must be a string or a list of token ids", "prompt", "invalid_type")
    if not ids:
        raise bad("the prompt is empty", "prompt", "invalid_value")
    return ids


def chat_prompt_ids(body: dict, info: ModelInfo) -> list[int]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' must be a non-empty list", "messages", "invalid_type")
    clean = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a 'role'", "messages", "invalid_type")
        content = m.get("content", "")
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
        clean.append({"role": m["role"], "content": content})
    if info.tokenizer is None:
        raise bad("this model has no tokenizer, so chat is not available; use /v1/completions with token ids",
                  "messages")
    if info.chat_template:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        text = env.from_string(info.chat_template).render(
            messages=clean, add_generation_prompt=True, bos_token=info.bos_token, eos_token=info.eos_token)
        return info.tokenizer.encode(text, add_special_tokens=False)
    return info.tokenizer.encode(default_chat_text(clean))


def default_chat_text(messages: list[dict]) -> str:
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


@dataclass
class GenOptions:
    params: dict            # wire sampling params for the workers
    stream: bool
    include_usage: bool
    stop: list[str]


def gen_options(body: dict, info: ModelInfo, n_prompt: int, max_tokens_name: str = "max_tokens") -> GenOptions:
    if n_prompt >= info.max_model_len:
        raise bad(f"the prompt has {n_prompt} tokens but the model's context is {info.max_model_len} tokens",
                  "prompt", "context_length_exceeded")
    room = info.max_model_len - n_prompt
    name = max_tokens_name
    if body.get(name) is None and max_tokens_name == "max_completion_tokens":
        name = "max_tokens"
    default = min(16, room) if max_tokens_name == "max_tokens" else room
    mt = _int(body, name, default, lo=1)
    if mt > room:
        raise bad(f"'{name}' is {mt} but the prompt ({n_prompt} tokens) leaves room for {room} tokens "
                  f"in the model's context of {info.max_model_len}", name, "context_length_exceeded")
    n = _int(body, "n", 1, lo=1)
    if n != 1:
        raise bad("only n=1 is supported", "n", "unsupported")
    if body.get("logprobs") not in (None, False, 0) or body.get("best_of") not in (None, 1):
        raise bad("logprobs and best_of are not supported", "logprobs", "unsupported")
    params = {"max_tokens": mt,
              "temperature": _float(body, "temperature", 1.0, 0.0, 2.0),  # 1: the OpenAI default
              "top_p": _float(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
              "top_k": _int(body, "top_k", 0, lo=0),
              "ignore_eos": _bool(body, "ignore_eos", False)}
    seed = _int(body, "seed", None)
    if seed is not None:
        params["seed"] = seed
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise bad("'stop_token_ids' must be a list of integers", "stop_token_ids", "invalid_type")
    params["stop_token_ids"] = stop_ids
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise bad("'stop' must be a string or a list of strings", "stop", "invalid_type")
    stop = [s for s in stop if s]
    if stop and info.tokenizer is None:
        raise bad("stop strings need a tokenizer", "stop")
    stream = _bool(body, "stream", False)
    so = body.get("stream_options") or {}
    if not isinstance(so, dict):
        raise bad("'stream_options' must be an object", "stream_options", "invalid_type")
    return GenOptions(params, stream, bool(so.get("include_usage", False)), stop)


class Detokenizer:
    """Text of a growing token list, released only where it is final: no half UTF-8 character at
    the end, and no tail that could still become a stop string."""

    def __init__(self, tokenizer, stop: list[str]) -> None:
        self.tok, self.stop = tokenizer, stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0
        self.stopped = False

    def text(self) -> tuple[str, bool]:
        """The whole text so far, cut before the first stop string; and whether one was found."""
        if self.tok is None:
            return "", False
        text = self.tok.decode(self.ids)
        cut = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        return (text[: min(cut)], True) if cut else (text, False)

    def push(self, ids: list[int], final: bool = False) -> str:
        self.ids.extend(ids)
        if self.tok is None:
            return ""
        text, stopped = self.text()
        if stopped:
            final = self.stopped = True
        if not final:
            if text.endswith("\ufffd"):
                return ""
            text = text[: max(len(text) - self.hold, self.sent)]
        out = text[self.sent:]
        self.sent = len(text)
        return out
