"""Text <-> token ids: a thin wrapper over a `tokenizers` tokenizer.json, plus the tiny preset's
byte-level vocabulary, which is built in-process (nothing downloaded, nothing trained).

The tiny vocabulary has 259 entries: 0 `<|pad|>`, 1 `<|bos|>`, 2 `<|eos|>`, then byte b at id
3 + b (bytes shown with the GPT-2 byte-to-printable-character mapping that `tokenizers`'
ByteLevel pre-tokenizer and decoder use). Encoding prepends `<|bos|>`. There are no merges, so
any text round-trips and every id decodes.

Callers that already have token ids skip the tokenizer entirely: the engine takes ids, and
`parse_token_ids` turns "1,2,3" into [1, 2, 3].
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors

from ..errors import UserError

TINY_SPECIALS = ("<|pad|>", "<|bos|>", "<|eos|>")


def byte_to_char() -> dict[int, str]:
    """GPT-2 style: printable Latin-1 bytes stand for themselves, the other 68 bytes are moved to
    code points 256.. in byte order, so every byte is one visible character."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def tiny_tokenizer() -> HFTokenizer:
    vocab = {tok: i for i, tok in enumerate(TINY_SPECIALS)}
    for b, ch in byte_to_char().items():
        vocab[ch] = len(TINY_SPECIALS) + b
    tk = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(list(TINY_SPECIALS))
    tk.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A $B", special_tokens=[("<|bos|>", 1)])
    return tk


_CHAR_TO_BYTE = {c: b for b, c in byte_to_char().items()}


class Tokenizer:
    """encode/decode with a model's tokenizer; `eos_ids` are the ids that end generation."""

    def __init__(self, tk: HFTokenizer, eos_ids: tuple[int, ...] = ()) -> None:
        self.tk = tk
        self.eos_ids = eos_ids
        self._max_token_chars: int | None = None
        self._special: set[int] | None = None   # its special tokens' ids (token_bytes)

    @classmethod
    def from_file(cls, path: str | Path, eos_ids: tuple[int, ...] = ()) -> "Tokenizer":
        return cls(HFTokenizer.from_file(str(path)), eos_ids)

    @classmethod
    def from_dir(cls, path: str | Path, eos_ids: tuple[int, ...] = ()) -> "Tokenizer | None":
        f = Path(path) / "tokenizer.json"
        return cls.from_file(f, eos_ids) if f.is_file() else None

    @classmethod
    def tiny(cls) -> "Tokenizer":
        return cls(tiny_tokenizer(), eos_ids=(2,))

    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch releases the GIL (encode does not): a long text tokenized on a thread of the
        # server's front end leaves its event loop running
        return self.tk.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    @property
    def max_token_chars(self) -> int:
        """Characters of the longest vocabulary entry (added tokens included): no token covers more."""
        if self._max_token_chars is None:
            self._max_token_chars = max(map(len, self.tk.get_vocab(with_added_tokens=True)), default=1)
        return self._max_token_chars

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, tok: int) -> bytes:
        """The bytes token `tok` stands for in the text (b"" for a special token, left out of the
        text): a byte-level piece's own bytes (part of a character: not U+FFFD's), a
        SentencePiece byte-fallback piece's (<0xE2>), else its text's UTF-8."""
        if self._special is None:
            self._special = {i for i, t in self.tk.get_added_tokens_decoder().items() if t.special}
        piece = self.tk.id_to_token(tok)
        if piece is None or tok in self._special:
            return b""
        if isinstance(self.tk.decoder, decoders.ByteLevel) and all(c in _CHAR_TO_BYTE for c in piece):
            return bytes(_CHAR_TO_BYTE[c] for c in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        return self.decode([tok], skip_special_tokens=False).encode("utf-8")


def parse_token_ids(text: str) -> list[int]:
    """ "1,2, 3" -> [1, 2, 3]; a clear UserError otherwise."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        raise UserError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise UserError("--prompt-ids is empty")
    if any(i < 0 for i in ids):
        raise UserError("--prompt-ids must be non-negative")
    return ids
