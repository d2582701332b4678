"""Text prompts of an exact token count, measured by the server's own tokenizer.

The bench knows no tokenizer; the server does (vLLM's `POST /tokenize`, which splitserve serves
too). A text prompt of n tokens is made from a seeded source text (random lowercase words, or a
ShareGPT turn) by a search over its character prefixes for one the server counts as n tokens
(a proportional first guess, then galloping and binary search: `fit_text`). What is counted is what the endpoint will run: for `/v1/completions` the
prompt with the tokenizer's special tokens (BOS), for `/v1/chat/completions` the whole chat (the
message in the server's chat template), so n is the prefill's length either way. Adding a
character changes the count by at most one token for most tokenizers (byte-level ones: exactly
one per ASCII character), so the search lands on n; where a prefix skips over n, or n is below a
chat template's own length, the nearest count the server confirms is used, and that count is the
request's `prompt_tokens` (the run reports how many prompts missed: `bench.prompt_tokens_off`).
Cost, before the timed run starts: 2 tokenize calls per prompt with a byte-level tokenizer
(the source's count and the guess), a few more with a BPE one (at most about 2 log2(4 n) + 3).
"""

from __future__ import annotations

import asyncio
import string

import numpy as np

from ..errors import UserError

TEXT_SEED_SALT = 0x7E47
PREP_CONCURRENCY = 8


class ServerTokenizer:
    """Token counts and ids from the server's `POST /tokenize` (`chat`: of one user message)."""

    def __init__(self, client, base: str, model: str | None, headers: dict | None, chat: bool) -> None:
        self.client, self.base, self.model, self.headers, self.chat = client, base, model, headers, chat
        self.calls = 0

    async def _post(self, body: dict) -> dict:
        import httpx

        if self.model is not None:
            body["model"] = self.model
        self.calls += 1
        try:
            r = await self.client.post(self.base + "/tokenize", json=body, headers=self.headers)
        except httpx.HTTPError as e:
            raise UserError(f"POST {self.base}/tokenize failed: {type(e).__name__}: {e}") from None
        if r.status_code == 404:
            raise UserError(f"the server at {self.base} has no POST /tokenize (vLLM's), which text prompts "
                            f"and --dataset sharegpt need; use --prompt-format ids with --dataset random or a workload")
        if r.status_code != 200:
            raise UserError(f"POST {self.base}/tokenize answered HTTP {r.status_code}: {r.text[:200].strip()}")
        return r.json()

    async def count(self, text: str) -> int:
        """Tokens the endpoint runs for this prompt text."""
        if self.chat:
            js = await self._post({"messages": [{"role": "user", "content": text}]})
        else:
            js = await self._post({"prompt": text, "add_special_tokens": True})
        return int(js["count"])

    async def ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        js = await self._post({"prompt": text, "add_special_tokens": add_special_tokens})
        return [int(t) for t in js["tokens"]]


def random_words(rng: np.random.Generator, chars: int) -> str:
    """About `chars` characters of random lowercase words (1 to 8 letters) separated by spaces."""
    letters = np.array(list(string.ascii_lowercase))
    words = []
    total = 0
    while total < chars:
        w = "".join(letters[rng.integers(0, 26, int(rng.integers(1, 9)))])
        words.append(w)
        total += len(w) + 1
    return " ".join(words)


async def fit_text(source: str, n: int, tok: ServerTokenizer, empty: int, full: int) -> tuple[str, int]:
    """A prefix of `source` that the server counts as `n` tokens, and its count (the nearest count
    when no prefix has exactly n). `empty` and `full` are the counts of "" and of `source`
    (full >= n). The first guess is proportional (exact for byte-level tokenizers); from it a
    galloping search brackets n, and a binary search closes the bracket."""
    if n <= empty:
        return "", empty
    L = len(source)
    k = min(L, max(1, round(L * (n - empty) / max(full - empty, 1))))
    c = await tok.count(source[:k])
    if c == n:
        return source[:k], c
    gap = max(1, abs(n - c))
    if c < n:                           # gallop up to a prefix counting >= n
        lo, hi = k, L
        while lo + gap < L:
            cn = await tok.count(source[: lo + gap])
            if cn == n:
                return source[: lo + gap], cn
            if cn > n:
                hi = lo + gap
                break
            lo, gap = lo + gap, gap * 2
    else:                               # gallop down to a prefix counting < n
        lo, hi = 0, k
        while hi - gap > 0:
            cn = await tok.count(source[: hi - gap])
            if cn == n:
                return source[: hi - gap], cn
            if cn < n:
                lo = hi - gap
                break
            hi, gap = hi - gap, gap * 2
    while hi - lo > 1:                  # count(lo) < n <= count(hi): the smallest k counting >= n
        mid = (lo + hi) // 2
        cm = await tok.count(source[:mid])
        if cm == n:
            return source[:mid], cm
        if cm > n:
            hi = mid
        else:
            lo = mid
    got = await tok.count(source[:hi])
    if got != n:                        # it skipped over n: the prefix one shorter may be nearer
        below = await tok.count(source[:lo])
        if n - below < got - n:
            return source[:lo], below
    return source[:hi], got


class TextPrompts:
    """Exact-length text prompts for a whole plan, made with the server's tokenizer."""

    def __init__(self, tok: ServerTokenizer, seed: int) -> None:
        self.tok = tok
        self.rng = np.random.default_rng([seed, TEXT_SEED_SALT])
        self._empty: int | None = None

    async def empty(self) -> int:
        if self._empty is None:
            self._empty = await self.tok.count("")
        return self._empty

    async def make(self, n: int, source: str | None = None) -> tuple[str, int]:
        """A prompt text of `n` tokens (from `source`, else random words) and the server's count."""
        empty = await self.empty()
        if not source:
            source = random_words(self.rng, 4 * n + 64)
        full = await self.tok.count(source)
        while full < n:                 # too short: repeat it (a ShareGPT turn shorter than asked)
            source = source + " " + source
            full = await self.tok.count(source)
        if full == n:
            return source, n
        return await fit_text(source, n, self.tok, empty, full)

    async def make_all(self, wants: list[tuple[int, str | None]]) -> list[tuple[str, int]]:
        """`make` for each (n, source), at most PREP_CONCURRENCY at a time; the random sources are
        drawn in order first, so the texts depend on the seed only."""
        await self.empty()
        sources = [s if s else random_words(self.rng, 4 * n + 64) for n, s in wants]
        sem = asyncio.Semaphore(PREP_CONCURRENCY)

        async def one(n: int, s: str) -> tuple[str, int]:
            async with sem:
                return await self.make(n, s)

        return list(await asyncio.gather(*(one(n, s) for (n, _), s in zip(wants, sources))))
