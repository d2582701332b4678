"""What every performance model answers (perf/__init__.py has the forms): `PerfModel`, a batch's
seconds on one machine, and `PowerModel`, its watts. Here, apart from the models, so that each
model's module can name them."""

from __future__ import annotations

from typing import Protocol


class PerfModel(Protocol):
    source: str        # which model answers: "profile:<path>", "operators" or "roofline"
    attention: float   # seconds per squared prompt token of a prefill (perf/mixed.py; 0: none)
    additive: bool     # a mixed step is the sum of its parts, not the larger (perf/mixed.py)

    def prompt_time(self, tokens: int) -> float: ...

    def token_time(self, batch: int, context: int) -> float: ...

    def mixed_time(self, prompt_tokens: int, batch: int, context: int, prompt_sq: int = 0) -> float: ...


class PowerModel(Protocol):
    def prompt_power_w(self, tokens: int) -> float: ...

    def token_power_w(self, batch: int) -> float: ...

    def idle_power_w(self) -> float: ...
