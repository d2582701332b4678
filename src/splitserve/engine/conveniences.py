"""LLMEngine's blocking conveniences over its step loop: run prompts to completion together
(`generate`), prefill one prompt now and hand back its first token and KV (`prefill_only`)."""

from __future__ import annotations

from .outputs import PrefillResult, RequestOutput, StepFailed
from .sampler import SamplingParams


class Conveniences:
    """Mixed into LLMEngine (which provides add_request, abort, step and _stashed)."""

    def generate(self, prompts: list[list[int]] | list[str],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run the prompts to completion together; final outputs in prompt order."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids: list[str] = []
        try:
            for p, sp in zip(prompts, plist, strict=True):
                ids.append(self.add_request(p, sp))
        except Exception:
            for rid in ids:  # all or nothing
                self.abort(rid)
            raise
        final: dict[str, RequestOutput] = {}
        while len(final) < len(ids):
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[i] for i in ids]

    def prefill_only(self, prompt_ids: list[int] | str, params: SamplingParams | None = None,
                     request_id: str | None = None, resumed: int = 0) -> PrefillResult:
        """Prefill one prompt now (prompt worker): its first token and the prompt's KV (`resumed`:
        the last ids are outputs made before a preemption; their KV comes too, and the token is
        the next output).

        Other requests in this engine advance too; their outputs come with the next `step()`. If a
        step fails (StepFailed), this request is dropped too and the error propagates."""
        rid = self.add_request(prompt_ids, params, request_id, prefill_only=True, resumed=resumed)
        mine: list[RequestOutput] = []  # its one output: it finishes at its first token
        others: list[RequestOutput] = []
        try:
            while not mine:
                for out in self.step():
                    (mine if out.request_id == rid else others).append(out)
        except StepFailed:
            self.abort(rid)
            raise
        finally:
            self._stashed = others + self._stashed
        out = mine[0]
        return PrefillResult(rid, out.new_token_ids[0], out.kv, out.finish_reason != "prefill", out.finish_reason,
                             out.logits)
