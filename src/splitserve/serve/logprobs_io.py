"""Log-probabilities in the OpenAI API's three forms, from the engine's records (engine/logprobs.py:
`(token, logprob, rank, top)`, top the N most likely as (token, logprob)).

- Completions (`logprobs` N): `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, one
  entry per token; each top_logprobs entry maps the token's text, then the N most likely tokens'
  texts, to their logprobs (as vLLM: the chosen token is always among them). With `echo` the
  prompt's tokens come first, the very first with None (nothing comes before it).
  text_offset: where each token's text starts in the choice's text (the prompt's, with echo),
  counted on the text itself (`TextOffsets`): a special token (the BOS) adds nothing to it, the
  byte-level pieces of one character add that character once.
- Chat (`logprobs: true`, `top_logprobs` N): `{"content": [{"token", "logprob", "bytes",
  "top_logprobs": [the N most likely, same keys]}], "refusal": None}`.
- vLLM's `prompt_logprobs` N (both endpoints): per prompt position, None for the first, else
  {token id: {"logprob", "rank", "decoded_token"}} for the prompt's token and the N most likely.

A token's text is its own decoding, special tokens kept (a byte-level token that is part of a
multi-byte character decodes to U+FFFD, as in vLLM); chat's `bytes` are the token's own bytes
(Tokenizer.token_bytes: such a piece's byte, not U+FFFD's three). A logprob of -inf is written as
-9999.0 (vLLM's stand-in: JSON has no infinity).
"""

from __future__ import annotations

import codecs

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine.tokenizer import Tokenizer

FLOOR = -9999.0


class TokenTexts:
    """Each token id's own text and bytes (cached: a response names the same tokens over and over)."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}
        self.bytes_cache: dict[int, bytes] = {}

    def bytes(self, tok: int) -> bytes:
        b = self.bytes_cache.get(tok)
        if b is None:
            b = self.bytes_cache[tok] = self.tokenizer.token_bytes(tok) if self.tokenizer is not None \
                else self(tok).encode("utf-8")
        return b

    def __call__(self, tok: int) -> str:
        s = self.cache.get(tok)
        if s is None:
            s = self.cache[tok] = self.tokenizer.decode([tok], skip_special_tokens=False) \
                if self.tokenizer is not None else str(tok)
        return s


class TextOffsets:
    """A running position in a choice's text, in characters: `at(tok)` is where token `tok`'s text
    starts, the text being its bytes and those of every token before, decoded (a character still
    missing bytes counts once it is whole)."""

    def __init__(self, text: TokenTexts) -> None:
        self.text = text
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.chars = 0

    def at(self, tok: int) -> int:
        start = self.chars
        self.chars += len(self.decoder.decode(self.text.bytes(tok)))
        return start


def _lp(x: float) -> float:
    return x if x > FLOOR else FLOOR


def completion_logprobs(text: TokenTexts, recs: list, where: TextOffsets, n: int,
                        prompt: tuple | None = None) -> dict:
    """The completions form of `recs` (generated tokens), their offsets running on in `where`;
    `prompt` (its ids, its records from position 1): the echoed prompt's entries first."""
    tokens: list[str] = []
    lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    rows = [(t, None) for t in prompt[0][:1]] + [(r[0], r) for r in prompt[1]] if prompt else []
    for tok, r in rows + [(r[0], r) for r in recs]:
        s = text(tok)
        tokens.append(s)
        offsets.append(where.at(tok))
        if r is None:
            lps.append(None)
            tops.append(None)
            continue
        lps.append(_lp(r[1]))
        top = {s: _lp(r[1])}
        for t, v in r[3][:n]:
            top.setdefault(text(t), _lp(v))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def _entry(text: TokenTexts, tok: int, lp: float) -> dict:
    return {"token": text(tok), "logprob": _lp(lp), "bytes": list(text.bytes(tok))}


def chat_logprobs(text: TokenTexts, recs: list, n: int) -> dict:
    """The chat form of `recs`, with the `n` most likely tokens of each step."""
    return {"content": [{**_entry(text, r[0], r[1]), "top_logprobs": [_entry(text, t, v) for t, v in r[3][:n]]}
                        for r in recs], "refusal": None}


def prompt_logprobs(text: TokenTexts, recs: list, n: int) -> list:
    """vLLM's `prompt_logprobs` of a prompt's records (position 1 on): None first."""
    out: list = [None]
    for tok, lp, rank, top in recs:
        d = {str(tok): {"logprob": _lp(lp), "rank": rank, "decoded_token": text(tok)}}
        for i, (t, v) in enumerate(top[:n]):
            d.setdefault(str(t), {"logprob": _lp(v), "rank": i + 1, "decoded_token": text(t)})
        out.append(d)
    return out
