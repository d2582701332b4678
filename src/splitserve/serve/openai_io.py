"""The OpenAI wire format at the edge: JSON bodies, error bodies, the served model's facts and
chat prompts. No HTTP framework here (api.py serves; schema.py checks request fields;
detokenize.py turns tokens back into text).

Errors are `ApiError(status, message, type, param, code)`, rendered as
`{"error": {"message", "type", "param", "code"}}`.

Chat prompts use the tokenizer's own chat template (`chat_template` in the model directory's
tokenizer_config.json, rendered with Jinja2 in a sandbox) when there is one; otherwise the
DEFAULT CHAT TEMPLATE, which renders each message as

    <|role|>\\n{content}\\n

(role = system, user or assistant) and then `<|assistant|>\\n` (left out with vLLM's
`add_generation_prompt: false`), tokenized with the tokenizer's special tokens (BOS for `tiny`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from .tools import rendered_call

if TYPE_CHECKING:
    from ..engine.tokenizer import Tokenizer

orjson: ModuleType | None
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


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object; 400 for anything else (invalid JSON or UTF-8, too deep a nesting,
    unpaired surrogates, a top level that is not an object)."""
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
        except RecursionError:
            raise bad("the request body is nested too deeply", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_json")
    return body


@dataclass
class ModelInfo:
    name: str
    tokenizer: Tokenizer | None
    vocab_size: int
    max_model_len: int             # lowered to what the workers can hold once they are up
    chat_template: str | None = None
    bos_token: str = ""
    eos_token: str = ""
    scores: bool = True            # its workers compute logits (False with --worker-mode echo): logprobs served

    @property
    def max_prompt_chars(self) -> int:
        """Characters a text prompt may have: one token covers at most the longest vocabulary entry,
        so a longer text cannot fit the context, and it is refused before it is tokenized."""
        longest = self.tokenizer.max_token_chars if self.tokenizer is not None else 1
        return self.max_model_len * longest

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
            if info.chat_template is None and (p / "chat_template.jinja").is_file():  # transformers >= 4.43 saves it so
                info.chat_template = (p / "chat_template.jinja").read_text()
            return info
        cfg = get_preset(model)
        tok = Tokenizer.tiny() if model.startswith("tiny") else None
        return cls(model, tok, cfg.vocab_size, cfg.max_position_embeddings)


def _token_str(t) -> str:
    if isinstance(t, dict):
        return t.get("content", "")
    return t or ""


def render_chat(messages: list[dict], info: ModelInfo, add_generation_prompt: bool = True,
                tools: list[dict] | None = None) -> str:
    """The prompt text of checked chat messages (prompts.chat_messages) and the function `tools`
    offered ({"type": "function", "function": {...}} each, or None): the tokenizer's own chat
    template when it has one (Jinja2, sandboxed; `tools` passed as transformers does), else
    DEFAULT CHAT TEMPLATE."""
    if info.tokenizer is None:
        raise bad("this model has no tokenizer, so chat is not available; use /v1/completions with token ids",
                  "messages")
    if info.chat_template:
        import jinja2

        try:
            return chat_env().from_string(info.chat_template).render(
                messages=messages, add_generation_prompt=add_generation_prompt, bos_token=info.bos_token,
                eos_token=info.eos_token, tools=tools)
        except jinja2.TemplateError as e:  # the template's raise_exception, or a template it cannot run
            raise bad(f"the chat template refused these messages: {e}", "messages", "invalid_value") from None
    return default_chat_text(messages, add_generation_prompt, tools)


def read_chat_template(path: Path) -> str:
    """serve --chat-template's text, checked to parse; a UserError naming the file otherwise."""
    import jinja2

    from ..errors import UserError
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read --chat-template {path}: {e.strerror}") from None
    try:
        chat_env().parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise UserError(f"--chat-template {path} is not a Jinja2 template: {e.message} (line {e.lineno})") from None
    return text


def chat_env():
    """A sandboxed Jinja2 environment as transformers' apply_chat_template makes one: blocks trimmed,
    loop controls, `tojson` without ASCII escapes, `raise_exception` and `strftime_now` (Llama 3's
    templates use them)."""
    import datetime

    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise jinja2.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def default_chat_text(messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None) -> str:
    """`<|role|>\n{content}\n` per message (an assistant's earlier tool calls after its content, in
    serve/tools.py's form), after `<|tools|>\n{the functions as compact JSON}\n` where tools are
    offered."""
    text = f"<|tools|>\n{json.dumps([t['function'] for t in tools], separators=(',', ':'))}\n" if tools else ""
    text += "".join(f"<|{m['role']}|>\n{m['content']}{''.join(map(rendered_call, m.get('tool_calls', ())))}\n"
                    for m in messages)
    return text + "<|assistant|>\n" if add_generation_prompt else text
