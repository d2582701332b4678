"""What a request may ask of an engine: checked when it is added (live_requests.py LiveRequests.new,
for every request an engine takes), a UserError naming what is wrong otherwise."""

from __future__ import annotations

from ..errors import UserError
from .sampler import SamplingParams


def check_request(ids: list[int], params: SamplingParams, vocab_size: int, max_model_len: int, kv_tokens: int,
                  has_tokenizer: bool) -> None:
    """A prompt of token ids `ids`, none empty and each in the vocabulary, that leaves room for one
    generated token in the context (`max_model_len`) and fits the KV cache (`kv_tokens`); logit
    bias within the vocabulary; stop strings only with a tokenizer."""
    if not ids:
        raise UserError("the prompt is empty")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise UserError(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")
    bad = [t for t, _ in params.logit_bias if t >= vocab_size]
    if bad:
        raise UserError(f"logit_bias token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})")
    if len(ids) >= max_model_len:
        raise UserError(f"prompt has {len(ids)} tokens but the model context is {max_model_len} "
                        f"tokens (the prompt must leave room for at least one generated token)")
    if len(ids) >= kv_tokens:
        raise UserError(f"prompt has {len(ids)} tokens but the KV cache holds only {kv_tokens} tokens")
    if params.stop and not has_tokenizer:
        raise UserError("stop strings need a tokenizer")
