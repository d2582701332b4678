"""Output-length predictors: what a policy may know of a request's output length before it runs.

TetriInfer, Aladdin and EcoServe schedule by a predicted output length. A predictor answers
`predict(rid, prompt_tokens, output_tokens) -> Prediction(lo, hi)`, the range it believes the
output falls in. `output_tokens` is the truth (the simulator knows it; the live router knows it
as max_tokens under `ignore_eos`); a learned predictor would read the prompt instead. Predictions
are a function of (seed, request id) only, never of the order of calls, so the simulator and the
live router predict alike for the same requests.

- `OraclePredictor`: the truth (lo = hi = output_tokens).
- `BucketPredictor(granularity, accuracy)`: TetriInfer's classifier (§3.3.2): the output's bucket
  of `granularity` tokens with probability `accuracy` (its reported 58.9%, 74.9%, 85.0% for 100-,
  200- and 400-token buckets), else a neighbouring bucket, above or below at random (ASSUMED: the
  paper does not say where wrong answers fall).
- `RelativePredictor(accuracy, padding)`: EcoServe's fine-tuned OPT-13B (§2.3): its estimate times
  (1 + padding) covers the true length for `accuracy` of requests (77.5%, 73.2%, 69.8% at 10%,
  15%, 20% padding for Alpaca, ShareGPT, BookCorpus). ASSUMED error model (the paper gives none):
  the estimate is the truth times exp(N(0, s^2)), s = ln(1 + padding) / Phi^-1(accuracy), so that
  P(estimate * (1 + padding) >= truth) = accuracy; lo = hi = the padded estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from collections.abc import Callable
from typing import NamedTuple, Protocol

from ..errors import UserError
from .machine import BatchingConfig
from .schedulers import SCHEDULERS
from .state import Request

_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit value from any integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def uniform(seed: int, rid: int, k: int = 0) -> float:
    """The k-th uniform draw in [0, 1) for request `rid` under `seed`: counter-based, so it does not
    depend on which requests were predicted before."""
    return (_mix(_mix(_mix(seed) ^ rid) ^ k) >> 11) * (1.0 / (1 << 53))


class Prediction(NamedTuple):
    lo: int      # output tokens, at least
    hi: int      # output tokens, at most (as believed)


class LengthPredictor(Protocol):
    @property
    def name(self) -> str: ...

    def predict(self, rid: int, prompt_tokens: int, output_tokens: int) -> Prediction: ...


@dataclass(frozen=True, slots=True)
class OraclePredictor:
    name: str = "oracle"

    def predict(self, rid: int, prompt_tokens: int, output_tokens: int) -> Prediction:
        return Prediction(output_tokens, output_tokens)


@dataclass(frozen=True, slots=True)
class BucketPredictor:
    granularity: int = 200
    accuracy: float = 0.749
    seed: int = 0
    name: str = "tetriinfer"

    def __post_init__(self) -> None:
        if self.granularity < 1 or not 0.0 <= self.accuracy <= 1.0:
            raise UserError(f"bucket predictor: granularity >= 1 and accuracy in [0, 1], got "
                            f"{self.granularity}, {self.accuracy}")

    def predict(self, rid: int, prompt_tokens: int, output_tokens: int) -> Prediction:
        b = (output_tokens - 1) // self.granularity            # bucket 0: 1..granularity tokens
        if uniform(self.seed, rid) >= self.accuracy:            # wrong: a neighbouring bucket
            b = b + 1 if b == 0 or uniform(self.seed, rid, 1) < 0.5 else b - 1
        return Prediction(b * self.granularity + 1, (b + 1) * self.granularity)


@dataclass(frozen=True, slots=True)
class RelativePredictor:
    accuracy: float = 0.732
    padding: float = 0.15
    seed: int = 0
    name: str = "ecoserve"

    def __post_init__(self) -> None:
        if not 0.5 < self.accuracy < 1.0 or self.padding <= 0.0:
            raise UserError(f"relative predictor: accuracy in (0.5, 1) and padding > 0, got "
                            f"{self.accuracy}, {self.padding}")

    @property
    def sigma(self) -> float:
        return math.log1p(self.padding) / NormalDist().inv_cdf(self.accuracy)

    def predict(self, rid: int, prompt_tokens: int, output_tokens: int) -> Prediction:
        u = min(max(uniform(self.seed, rid), 1e-12), 1 - 1e-12)
        est = output_tokens * math.exp(self.sigma * NormalDist().inv_cdf(u))
        n = max(1, round(est * (1.0 + self.padding)))
        return Prediction(n, n)


# name -> (predictor, its source); `make_predictor` adds the seed
PRESETS: dict[str, tuple[Callable[[int], LengthPredictor], str]] = {
    "oracle": (lambda seed: OraclePredictor(), "the true output length"),
    "tetriinfer-100": (lambda seed: BucketPredictor(100, 0.589, seed), "TetriInfer: 58.9% at 100-token buckets"),
    "tetriinfer-200": (lambda seed: BucketPredictor(200, 0.749, seed), "TetriInfer: 74.9% at 200-token buckets"),
    "tetriinfer-400": (lambda seed: BucketPredictor(400, 0.850, seed), "TetriInfer: 85.0% at 400-token buckets"),
    "ecoserve-alpaca": (lambda seed: RelativePredictor(0.775, 0.10, seed), "EcoServe: 77.5% at 10% padding (Alpaca)"),
    "ecoserve-sharegpt": (lambda seed: RelativePredictor(0.732, 0.15, seed), "EcoServe: 73.2% at 15% padding (ShareGPT)"),
    "ecoserve-bookcorpus": (lambda seed: RelativePredictor(0.698, 0.20, seed),
                            "EcoServe: 69.8% at 20% padding (BookCorpus)"),
}


def make_predictor(name: str, seed: int = 0) -> LengthPredictor:
    """A preset by name (PRESETS), seeded; UserError lists the names."""
    if name not in PRESETS:
        raise UserError(f"unknown length predictor {name!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[name][0](seed)


class _Routing(Protocol):
    @property
    def predictor(self) -> str: ...


class _Policy(Protocol):
    """What arrival_predictor reads of a PolicyConfig (policy/config.py, which imports this module)."""

    @property
    def batching(self) -> BatchingConfig: ...

    @property
    def routing(self) -> _Routing: ...


def arrival_predictor(policy: _Policy) -> LengthPredictor | None:
    """The output-length predictor whose estimate a request carries from its arrival under
    `policy` (a PolicyConfig: `routing.predictor`, seed 0 as the other predictive policies), None
    when its machine scheduler does not schedule by predicted lengths. The simulator predicts at
    arrival with it (`predict`), and so does the live router, which sends the estimate to its
    worker in `gen`."""
    if not SCHEDULERS[policy.batching.scheduler].predicts:
        return None
    return make_predictor(policy.routing.predictor)


def predict(r: Request, predictor: LengthPredictor) -> None:
    """`r` carries its predicted output tokens (the predictor's upper end: EcoServe's padded estimate)."""
    r.predicted = predictor.predict(r.id, r.prompt_tokens, r.output_tokens).hi
