"""Tokens back into text as they stream out, with stop strings: the front end's one detokenizer,
for streamed and whole responses alike.

Incremental: each push decodes only the tokens since the last complete character with the chunk
before them (the window `ids[prefix:]`) and the new chunk alone; the new text is the window's
text past the earlier chunk's. A window is advanced only when its text ends on a complete
character (not U+FFFD, the mark of a UTF-8 sequence still missing bytes), and UTF-8 decoding after
a complete character does not depend on what went before, so the concatenated pieces are the text
of decoding every token at once (tests/serve/test_detokenize.py checks it). The earlier chunk in
the window gives decoders that look at the previous token their context: SentencePiece strips the
leading space of a decode's first token, so a window must not start with a chunk that shows no
text (special tokens only), which would leave the next token first. A push costs the window, not
the whole output; only a stream of bytes that never completes a character (garbage) keeps a
window growing, and costs what decoding everything did.

Stop strings are searched only where the new text can have completed one, and text is released
only where it is final: no half character at the end, and no tail that could still become a stop
string (the longest stop string less one character is held back until the end). vLLM's options:
`include_stop` ends the text after the stop string found rather than before it; `skip_special`
False keeps special tokens in the text; stop strings are looked for only once more than
`min_tokens` tokens have come (before then the text is only held back).
"""

from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer, stop: list[str], include_stop: bool = False, skip_special: bool = True,
                 min_tokens: int = 0) -> None:
        self.tok, self.stop = tokenizer, stop
        self.include_stop, self.skip_special, self.min_tokens = include_stop, skip_special, min_tokens
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.prefix = 0           # the window starts here: the chunk before the newest tokens
        self.read = 0             # tokens up to here are in `out`
        self.prefix_text = ""     # decode(ids[prefix:read]) alone: never empty once prefix > 0
        self.out = ""             # text of ids[:read]
        self.searched = 0         # stop strings were looked for in out[:searched] already
        self.cut: int | None = None  # where the text ends: the first stop string's start (or end)
        self.sent = 0             # characters released by push
        self.stopped = False

    def _advance(self, final: bool) -> None:
        if self.read == len(self.ids):
            return
        window = self.tok.decode(self.ids[self.prefix:], skip_special_tokens=self.skip_special)
        if window.endswith("\ufffd") and not final:
            return  # a character still lacks bytes
        self.out += window[len(self.prefix_text):]
        chunk = self.tok.decode(self.ids[self.read:], skip_special_tokens=self.skip_special)
        if chunk:  # the next window starts at this chunk; one that shows nothing (special tokens)
            self.prefix, self.prefix_text = self.read, chunk  # would leave the next token first, and a
        else:      # decoder strips the first token's leading space (SentencePiece): keep the context
            self.prefix_text = window
        self.read = len(self.ids)
        if self.stop and self.cut is None:
            if len(self.ids) > self.min_tokens:
                self._search()
            self.searched = len(self.out)

    def _search(self) -> None:
        """Where the earliest stop string in the new text begins (or, with include_stop, ends)."""
        start = max(0, self.searched - self.hold)
        hits = [(i, len(s)) for i, s in ((self.out.find(s, start), s) for s in self.stop) if i >= 0]
        if hits:
            i, n = min(hits, key=lambda h: h[0])
            self.cut = i + n if self.include_stop else i

    def text(self) -> tuple[str, bool]:
        """The whole text so far (every pushed token, incomplete characters included), cut before
        the first stop string; and whether one was found."""
        if self.tok is None:
            return "", False
        self._advance(final=True)
        return (self.out[: self.cut], True) if self.cut is not None else (self.out, False)

    def push(self, ids: list[int], final: bool = False) -> str:
        """Add tokens; returns the text that became final with them (see the module docstring)."""
        self.ids.extend(ids)
        if self.tok is None:
            return ""
        self._advance(final)
        if self.cut is not None:
            final = self.stopped = True
            end = self.cut
        elif final:
            end = len(self.out)
        else:
            end = max(len(self.out) - self.hold, self.sent)
        piece = self.out[self.sent:end]
        self.sent = max(self.sent, end)
        return piece
