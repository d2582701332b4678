"""Next-token choice: greedy, or temperature / top-k / top-p sampling.

Sampling uses the exponential race: token = argmax(p_i / E_i) with E_i ~ Exp(1) i.i.d., which
picks token i with probability p_i. A request with a `seed` draws its E from a generator seeded
by (seed, index of the token being sampled), so its tokens depend only on its own seed and
logits: not on which other requests share the batch, and not on whether its prefill ran on
another engine (the prompt/token split gives the same tokens as one engine). Requests without a
seed draw from the engine's generator (seeded by the engine's `seed`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UserError


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings (need a tokenizer); the text is cut before them
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    return_logits: bool = False  # keep each sampled step's logits (float32, CPU) in the output

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise UserError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise UserError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise UserError(f"top_k must be >= 0, got {self.top_k}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _mix(seed: int, index: int) -> int:
    """A 63-bit generator seed from (request seed, token index) (splitmix64 finaliser)."""
    z = (seed * 0x9E3779B97F4A7C15 + index + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p nucleus to -inf. top_k 0 means off."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    rank = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, vocab)[:, None]
    drop = rank >= k
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
    before = probs.cumsum(-1) - probs  # probability mass of the better tokens
    drop |= before > top_p[:, None]  # the best token always stays (before == 0)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


class Sampler:
    def __init__(self, device: str | torch.device, seed: int = 0) -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor, params: list[SamplingParams], indices: list[int]) -> list[int]:
        """One token per row of `logits` (B, vocab); `indices[i]` is the position of that token in
        row i's output (0 for the first generated token)."""
        logits = logits.float()
        greedy = logits.argmax(-1)
        if all(p.greedy for p in params):
            return greedy.tolist()
        dev = logits.device
        temp = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=dev)
        x = logits / temp[:, None]
        if any(p.top_k > 0 or p.top_p < 1 for p in params):
            x = filter_logits(x, torch.tensor([p.top_k for p in params], device=dev),
                              torch.tensor([p.top_p for p in params], device=dev))
        probs = x.softmax(-1)
        noise = torch.ones_like(probs)
        unseeded = [i for i, p in enumerate(params) if p.seed is None and not p.greedy]
        if unseeded:
            noise[unseeded] = torch.empty(len(unseeded), probs.shape[1], device=dev).exponential_(
                generator=self.generator)
        for i, p in enumerate(params):
            if p.seed is not None and not p.greedy:
                g = torch.Generator(device=dev).manual_seed(_mix(p.seed, indices[i]))
                noise[i].exponential_(generator=g)
        sampled = (probs / noise).argmax(-1)
        is_greedy = torch.tensor([p.greedy for p in params], device=dev)
        return torch.where(is_greedy, greedy, sampled).tolist()
