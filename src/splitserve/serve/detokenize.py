"""Tokens back into text as they stream out, with stop strings: the front end's one detokenizer,
for streamed and whole responses alike.

Incremental: each push decodes only the tokens since the last complete character (the window
`ids[prefix:]`) and the chunk before it (`ids[prefix:read]`); the new text is the difference. A
window is advanced only when its text ends on a complete character (not U+FFFD, the mark of a
UTF-8 sequence still missing bytes), and UTF-8 decoding after a complete character does not depend
on what went before, so the concatenated pieces are the text of decoding every token at once
(tests/serve/test_detokenize.py checks it). Decoding the chunk before the new tokens with them
gives decoders that look at the previous token (SentencePiece's leading space) their context. A
push costs the window, not the whole output; only a stream of bytes that never completes a
character (garbage) keeps a window growing, and costs what decoding everything did.

Stop strings are searched only where the new text can have completed one, and text is released
only where it is final: no half character at the end, and no tail that could still become a stop
string (the longest stop string less one character is held back until the end).
"""

from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer, stop: list[str]) -> None:
        self.tok, self.stop = tokenizer, stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.prefix = 0           # the window starts here: the chunk before the newest tokens
        self.read = 0             # tokens up to here are in `out`
        self.prefix_text: str | None = ""  # decode(ids[prefix:read]) alone (None: not decoded yet)
        self.out = ""             # text of ids[:read]
        self.searched = 0         # stop strings were looked for in out[:searched] already
        self.cut: int | None = None  # where the earliest stop string begins
        self.sent = 0             # characters released by push
        self.stopped = False

    def _advance(self, final: bool) -> None:
        if self.read == len(self.ids):
            return
        if self.prefix_text is None:  # decoded when first needed: a single push never needs it
            self.prefix_text = self.tok.decode(self.ids[self.prefix:self.read])
        window = self.tok.decode(self.ids[self.prefix:])
        if window.endswith("\ufffd") and not final:
            return  # a character still lacks bytes
        self.out += window[len(self.prefix_text):]
        self.prefix, self.read = self.read, len(self.ids)
        self.prefix_text = None
        if self.stop and self.cut is None:
            start = max(0, self.searched - self.hold)
            hits = [i for i in (self.out.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                self.cut = min(hits)
            self.searched = len(self.out)

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
