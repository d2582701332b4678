"""The sampling parameters of a request as `gen` and `expect` carry them (the header's "p"), and
the dataclass form every message class shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar, dataclass_transform

_C = TypeVar("_C")


@dataclass_transform(frozen_default=True, kw_only_default=True)
def message_class(cls: type[_C]) -> type[_C]:
    """The form of every message class: a frozen, slotted, keyword-only dataclass (a function
    under dataclass_transform, so that type checkers know the fields and the keyword __init__)."""
    return dataclass(slots=True, frozen=True, kw_only=True)(cls)


@message_class
class WireParams:
    """The sampling parameters of a request, as `gen` and `expect` carry them (the header's "p").
    From a wire map: codec.py `params_from_wire` (checked)."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    ignore_eos: bool
    stop_token_ids: list[int]
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: list[tuple[int, float]] = field(default_factory=list)
    logprobs: int | None = None         # each generated token's logprob and the N most likely (engine/logprobs.py)
    prompt_logprobs: int | None = None  # each prompt token's logprob and the N most likely there
    grammar: str | None = None          # an llguidance grammar the output follows (engine/structured.py)
    min_p: float = 0.0                  # vLLM's: sampled tokens of at least min_p x the best one's probability
    min_tokens: int = 0                 # vLLM's: no EOS or stop token ends the output before this many

    def to_wire(self) -> dict[str, Any]:
        """The map on the wire: optional fields at their defaults left out."""
        d = {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
             "top_k": self.top_k, "ignore_eos": self.ignore_eos, "stop_token_ids": self.stop_token_ids}
        if self.seed is not None:
            d["seed"] = self.seed
        if self.presence_penalty != 0.0:
            d["presence_penalty"] = self.presence_penalty
        if self.frequency_penalty != 0.0:
            d["frequency_penalty"] = self.frequency_penalty
        if self.repetition_penalty != 1.0:
            d["repetition_penalty"] = self.repetition_penalty
        if self.logit_bias:
            d["logit_bias"] = self.logit_bias
        if self.logprobs is not None:
            d["logprobs"] = self.logprobs
        if self.prompt_logprobs is not None:
            d["prompt_logprobs"] = self.prompt_logprobs
        if self.grammar is not None:
            d["grammar"] = self.grammar
        if self.min_p:
            d["min_p"] = self.min_p
        if self.min_tokens:
            d["min_tokens"] = self.min_tokens
        return d
