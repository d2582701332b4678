"""The one composition rule for mixed batches, shared by every performance model.

Decodes ride in the prefill pass as `batch` extra tokens (paper §II-D, Fig. 2c): an iteration
with both costs the larger of the prefill of `prompt_tokens + batch` tokens and the decode alone.
"""


class MixedBatching:
    def mixed_time(self, prompt_tokens: int, batch: int, context: int) -> float:
        if batch <= 0:
            return self.prompt_time(prompt_tokens)
        if prompt_tokens <= 0:
            return self.token_time(batch, context)
        p = self.prompt_time(prompt_tokens + batch)
        t = self.token_time(batch, context)
        return p if p > t else t
