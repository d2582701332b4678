"""An engine's blocking conveniences over its step loop: run prompts to completion together
(`generate`), prefill one prompt now and hand back its first token and KV (`prefill_only`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .contract import StepFailed
from .outputs import PrefillResult, RequestOutput
from .sampler import SamplingParams


class StepLoop(Protocol):
    """What these drive (LLMEngine): requests in, steps out; `stashed`: outputs that go out with
    the next step."""

    stashed: list[RequestOutput]

    def add_request(self, prompt_ids: list[int] | str, params: SamplingParams | None = None,
                    request_id: str | None = None, prefill_only: bool = False, isolated: bool = False,
                    predicted: int = 0, resumed: int = 0) -> str: ...

    def abort(self, request_id: str) -> None: ...

    def step(self) -> list[RequestOutput]: ...


def generate(engine: StepLoop, prompts: Sequence[list[int] | str],
             params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
    """Run the prompts to completion together; final outputs in prompt order."""
    plist = params if isinstance(params, list) else [params] * len(prompts)
    ids: list[str] = []
    try:
        for p, sp in zip(prompts, plist, strict=True):
            ids.append(engine.add_request(p, sp))
    except Exception:  # cleaned up, then raised on
        for rid in ids:  # all or nothing
            engine.abort(rid)
        raise
    final: dict[str, RequestOutput] = {}
    while len(final) < len(ids):
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return [final[i] for i in ids]


def prefill_only(engine: StepLoop, prompt_ids: list[int] | str, params: SamplingParams | None = None,
                 request_id: str | None = None, resumed: int = 0) -> PrefillResult:
    """Prefill one prompt now (prompt worker): its first token and the prompt's KV (`resumed`:
    the last ids are outputs made before a preemption; their KV comes too, and the token is the
    next output).

    Other requests in the engine advance too; their outputs come with the next `step()`. If a
    step fails (StepFailed), this request is dropped too and the error propagates."""
    rid = engine.add_request(prompt_ids, params, request_id, prefill_only=True, resumed=resumed)
    mine: list[RequestOutput] = []  # its one output: it finishes at its first token
    others: list[RequestOutput] = []
    try:
        while not mine:
            for out in engine.step():
                (mine if out.request_id == rid else others).append(out)
    except StepFailed:
        engine.abort(rid)
        raise
    finally:
        engine.stashed = others + engine.stashed
    out = mine[0]
    return PrefillResult(rid, out.new_token_ids[0], out.kv, out.finish_reason != "prefill", out.finish_reason,
                         out.logits)
