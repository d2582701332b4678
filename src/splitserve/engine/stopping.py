"""When a sequence stops (a stop token, a stop string, its length) and the text it returns (cut
before a stop string)."""

from __future__ import annotations

from .sequence import Sequence
from .structured import complete


def stop_reason(seq: Sequence, tok: int, eos_ids: set[int], tokenizer) -> str | None:
    """"stop" (EOS unless ignored, a stop token or string, once it has made min_tokens), "length"
    (max_tokens, context), or None."""
    p = seq.params
    if complete(seq):  # its grammar allows nothing more, min_tokens or not
        return "stop"
    if len(seq.output_ids) >= p.min_tokens:  # min_tokens: nothing but the length stops it before
        if (tok in eos_ids and not p.ignore_eos) or tok in p.stop_token_ids:
            return "stop"
        if p.stop and stop_string_at(seq, tokenizer) is not None:
            return "stop"
    if len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= seq.max_len:
        return "length"
    return None

def stop_string_at(seq: Sequence, tokenizer) -> int | None:
    """Where the earliest stop string begins in the output text, if one has appeared. Only the
    tail that the newest token can have completed is decoded each step."""
    longest = max(len(s) for s in seq.params.stop)
    tail = tokenizer.decode(seq.output_ids[-(4 * longest + 4):])
    if not any(s in tail for s in seq.params.stop):
        return None
    text = tokenizer.decode(seq.output_ids)
    return min(i for i in (text.find(s) for s in seq.params.stop) if i >= 0)

def finish_text(seq: Sequence, tokenizer) -> str | None:
    if tokenizer is None:
        return None
    text = tokenizer.decode(seq.output_ids)
    if seq.params.stop:
        cut = [i for i in (text.find(s) for s in seq.params.stop) if i >= 0]
        if cut:
            text = text[: min(cut)]
    return text
