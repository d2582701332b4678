"""The one composition rule for mixed batches, shared by every performance model.

Decodes ride in the prefill pass as `batch` extra tokens (paper §II-D, Fig. 2c): an iteration
with both costs the larger of the prefill of `prompt_tokens + batch` tokens and the decode alone.
A model with an attention term (`attention` > 0: seconds per squared prompt token) adds
`attention * prompt_sq` to the prefill, where prompt_sq is the sum over the iteration's prompts of
their tokens squared. A model with `additive` set composes by sum instead: the prefill, plus what
the decodes add to a step beyond its fixed cost (token_time(batch, context) - token_time(1, 0)),
for an engine that runs the decodes' attention and sampling after the prefill's, not hidden in it
(splitserve's own engine on a CPU; the profile measures which rule fits, twin/machine.py).
"""

from __future__ import annotations

from .model import PerfModel


def prompt_alone(perf: PerfModel, tokens: int) -> float:
    """One prompt of `tokens` tokens alone: the prefill with its own attention term."""
    return perf.prompt_time(tokens) + perf.attention * tokens * tokens


class MixedBatching:
    attention = 0.0  # seconds per squared prompt token; 0: prefill time depends on the token count only
    additive = False  # compose a mixed step by sum (see above), not by max

    def prompt_time(self, tokens: int) -> float:
        """A prompt-only batch of `tokens` prompt tokens (each model has its own)."""
        raise NotImplementedError

    def token_time(self, batch: int, context: int) -> float:
        """One decode iteration of `batch` requests over `context` KV tokens (each model has its own)."""
        raise NotImplementedError

    def mixed_time(self, prompt_tokens: int, batch: int, context: int, prompt_sq: int = 0) -> float:
        if batch <= 0:
            return self.prompt_time(prompt_tokens) + self.attention * prompt_sq
        if prompt_tokens <= 0:
            return self.token_time(batch, context)
        p = self.prompt_time(prompt_tokens + batch) + self.attention * prompt_sq
        if self.additive:
            extra = self.token_time(batch, context) - self.token_time(1, 0)
            return p + extra if extra > 0.0 else p
        t = self.token_time(batch, context)
        return p if p > t else t
