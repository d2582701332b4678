"""Structured output: a request's grammar decides which tokens it may sample next.

`SamplingParams.grammar` is an llguidance grammar (`llguidance.LLMatcher.grammar_from_json_schema`
and friends make one from a JSON schema, a regex or a Lark grammar). llguidance (PyPI) was chosen
over xgrammar because it needs nothing else (one 3 MB wheel, no torch or triton of its own) and
runs on the CPU, where the mask is made either way. Each such sequence holds a matcher: before a
token is sampled for it, every token its grammar forbids is set to -inf in a copy of its logits
row (logprobs are of the raw logits, as vLLM's); the sampled token is then consumed. When the
grammar is complete (the matcher stopped) the sequence stops ("stop"), without sampling the EOS
that would be the only token left. A sequence that starts from a first token sampled elsewhere
(the token side of a KV hand-over) consumes that token first, so both sides walk one grammar.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from ..errors import UserError

if TYPE_CHECKING:
    import llguidance

    from .tokenizer import Tokenizer


class Matcher(Protocol):
    """What the engine calls on a grammar's matcher (llguidance.LLMatcher)."""

    def consume_token(self, token: int) -> bool: ...

    def compute_bitmask(self) -> bytes: ...

    def is_stopped(self) -> bool: ...


class Guided(Protocol):
    """A sequence as the grammar steps read it: its matcher, None when it has no grammar."""

    matcher: Matcher | None


class Grammars:
    """An engine's grammar matchers, over its tokenizer (made on first use: engines of a split
    cluster often run without a tokenizer of their own)."""

    def __init__(self, load_tokenizer: Callable[[], Tokenizer | None], vocab_size: int,
                 eos_ids: tuple[int, ...]) -> None:
        self._load, self.vocab_size, self.eos_ids = load_tokenizer, vocab_size, eos_ids
        self._tok: llguidance.LLTokenizer | None = None

    def matcher(self, grammar: str, made: Sequence[int] = ()) -> Matcher:
        """A new matcher of `grammar`, past the tokens `made` already (a resumed request's); UserError
        if the grammar is invalid or there is no tokenizer."""
        import llguidance

        if self._tok is None:
            tok = self._load()
            if tok is None:
                raise UserError("structured output needs the model's tokenizer (tokenizer.json)")
            self._tok = llguidance.LLTokenizer(tok.tk.to_str(), n_vocab=self.vocab_size,
                                               eos_token=list(self.eos_ids) or None)
        m = llguidance.LLMatcher(self._tok, grammar, log_level=0)
        if m.is_error():
            raise UserError(f"invalid grammar: {m.get_error()}")
        for t in made:
            m.consume_token(t)
        return m

    def mask(self, logits: torch.Tensor, seqs: Sequence[Guided]) -> torch.Tensor:
        """`logits` (one row per sequence of `seqs`, in order) with each guided sequence's forbidden
        tokens at -inf: a copy when any sequence is guided, else `logits` itself."""
        guided = [(i, s.matcher) for i, s in enumerate(seqs) if s.matcher is not None]
        if not guided:
            return logits
        out = logits.clone()
        for i, m in guided:
            ok = allowed(m, out.shape[1])
            if not ok.any():  # a matcher in error (never after its own tokens): only EOS, to end it
                ok[list(self.eos_ids)] = True
            out[i].masked_fill_(~ok.to(out.device), float("-inf"))
        return out


def allowed(matcher: Matcher, vocab_size: int) -> torch.Tensor:
    """The tokens `matcher` allows next, as a bool tensor over the vocabulary."""
    bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
    return torch.from_numpy(bits[:vocab_size].astype(bool))


def consume(seqs: Sequence[Guided], tokens: list[int]) -> None:
    """Each guided sequence's matcher takes its sampled token."""
    for s, tok in zip(seqs, tokens):
        if s.matcher is not None:
            s.matcher.consume_token(tok)


def complete(seq: Guided) -> bool:
    """Its grammar is complete: nothing but EOS could follow."""
    return seq.matcher is not None and seq.matcher.is_stopped()
