"""TetriInfer's decode dispatch (Hu et al., 2024; §3.4 "decode instance
selection"): which token machine decodes a prefilled request, by its predicted output length.

1. alpha: the token machines with KV memory free for the request's prompt and predicted output
   (the upper end of the predicted range, policy/predictor.py); when none has it, all of them
   (ASSUMED: the paper does not say; the request then waits for memory where it goes).
2. power of two: two machines of alpha at random (one if alpha has one).
3. of the two, the one with the lowest share of heavy decodes once this request is counted
   (heavy: predicted output over 128 tokens, §5.1 "as ShareGPT answers' median length is 128";
   the prediction's midpoint decides), since heavy decodes slow the light ones batched with them
   (§2.2.3); ties go to the fewer pending tokens (JSQ), then the lower id.

The random picks are counter-based draws of (seed, request id) (policy/predictor.py `uniform`),
so the simulator and the live router dispatch the same request alike. `Registry` keeps, per token
machine, the requests dispatched to it that have not finished (pruned when read).
"""

from __future__ import annotations

from collections.abc import Sequence

from .predictor import LengthPredictor, Prediction, uniform
from .state import Machine, Phase, Request

HEAVY_DECODE = 128


def heavy(p: Prediction) -> bool:
    return (p.lo + p.hi) / 2 > HEAVY_DECODE


class Registry:
    """The unfinished requests dispatched to each token machine, with their class."""

    def __init__(self) -> None:
        self.by_machine: dict[int, list[tuple[Request, bool]]] = {}

    def counts(self, m: Machine) -> tuple[int, int]:
        """(heavy, light) requests on `m` that have not finished."""
        live = [(r, h) for r, h in self.by_machine.get(m.id, ()) if r.phase is not Phase.DONE]
        self.by_machine[m.id] = live
        n_heavy = sum(h for _, h in live)
        return n_heavy, len(live) - n_heavy

    def add(self, m: Machine, r: Request, is_heavy: bool) -> None:
        self.by_machine.setdefault(m.id, []).append((r, is_heavy))


def pick_decode(tokens: Sequence[Machine], r: Request, predictor: LengthPredictor, registry: Registry,
                seed: int = 0) -> Machine:
    """The token machine for `r` (rules above); `r` is counted on it."""
    p = predictor.predict(r.id, r.prompt_tokens, r.output_tokens)
    need = r.prompt_tokens + p.hi
    alpha = [t for t in tokens if t.kv_round(need) <= t.kv_free] or list(tokens)
    if len(alpha) == 1:
        two = alpha
    else:
        i = int(uniform(seed, r.id, 2) * len(alpha))
        j = int(uniform(seed, r.id, 3) * (len(alpha) - 1))
        two = [alpha[i], alpha[j + (j >= i)]]
    h = heavy(p)

    def share(t: Machine) -> tuple[float, int, int]:
        nh, nl = registry.counts(t)
        nh += h
        return nh / (nh + nl + (not h)), t.pending, t.id

    best = min(two, key=share)
    registry.add(best, r, h)
    return best
