"""The streaming wire format of OpenAI `/v1/completions` and `/v1/chat/completions` (`"stream": true`).

The body is server-sent events: lines `data: {json chunk}`, blank lines between events, and a
final `data: [DONE]`. A completions chunk carries `choices[i].text`, a chat chunk
`choices[i].delta.content` (its first chunk only `delta.role`), and on some servers `token_ids`;
the last chunk may carry `usage` (vLLM with `stream_options.include_usage`, OpenAI), possibly
with an empty `choices` list.
"""

from __future__ import annotations

import json

DONE = object()       # the `data: [DONE]` sentinel


class StreamError(Exception):
    """A malformed line or an `error` object in the stream; its message is the reason."""


def parse_line(line: str):
    """None for lines that carry no event (blank, comments, `event:`/`id:` fields), DONE for
    the end marker, else the decoded chunk (a dict)."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]":
        return DONE
    if not payload:
        return None
    try:
        chunk = json.loads(payload)
    except ValueError:
        raise StreamError(f"bad_json: {payload[:80]!r}") from None
    if not isinstance(chunk, dict):
        raise StreamError(f"bad_json: {payload[:80]!r}")
    if "error" in chunk and not chunk.get("choices"):
        err = chunk["error"]
        msg = err.get("message", err) if isinstance(err, dict) else err
        raise StreamError(f"stream_error: {str(msg)[:120]}")
    return chunk


def _text(c: dict) -> str | None:
    d = c.get("delta")
    return d.get("content") if isinstance(d, dict) else c.get("text")


def chunk_tokens(chunk: dict) -> int:
    """Generated tokens one chunk carries: `len(token_ids)` when the server sends them, else one
    per choice that has text or is not yet finished (a token can decode to empty text, e.g. half
    of a UTF-8 character). A closing chunk with a finish reason and no text carries none, nor does
    a chat chunk that only announces the role."""
    n = 0
    for c in chunk.get("choices") or ():
        ids = c.get("token_ids")
        if isinstance(ids, list):
            n += len(ids)
        elif _text(c) or (c.get("finish_reason") is None and "role" not in (c.get("delta") or {})):
            n += 1
    return n


def chunk_output(chunk: dict) -> tuple[list[int], str]:
    """The token ids (when the server sends them) and the text one chunk carries."""
    ids: list[int] = []
    text = ""
    for c in chunk.get("choices") or ():
        if isinstance(c.get("token_ids"), list):
            ids += c["token_ids"]
        text += _text(c) or ""
    return ids, text


def usage_tokens(chunk: dict, key: str = "completion_tokens") -> int | None:
    """`usage[key]` when the chunk has it (`prompt_tokens`: what the server prefilled)."""
    u = chunk.get("usage")
    if isinstance(u, dict) and isinstance(u.get(key), int):
        return u[key]
    return None


def usage_cached(chunk: dict) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens` (prompt tokens the server's prefix cache gave)
    when the chunk has usage: 0 when usage lacks it, None when the chunk has no usage."""
    u = chunk.get("usage")
    if not isinstance(u, dict):
        return None
    d = u.get("prompt_tokens_details")
    n = d.get("cached_tokens") if isinstance(d, dict) else None
    return n if isinstance(n, int) else 0
