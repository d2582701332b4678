"""Next-token choice: logit bias and penalties, then greedy, or temperature / min-p / top-k /
top-p sampling.

Each row's logits go through, in this order (as in vLLM): `logit_bias`; while a row has made fewer
than `min_tokens` tokens, its EOS and stop token ids set to -inf (vLLM's min_tokens: they cannot be
sampled yet); the repetition penalty (prompt and output tokens), then the frequency and presence
penalties (output tokens); then a greedy row takes the argmax, and a sampled row is divided by its
temperature, cut to the tokens of at least `min_p` times its most likely token's probability, then
to its top-k / top-p nucleus, and sampled. A batch of plain greedy rows (no bias, no penalty, no
min_tokens) is one argmax.

Sampling uses the exponential race: token = argmax(p_i / E_i) with E_i ~ Exp(1) i.i.d., which
picks token i with probability p_i. A request with a `seed` draws its E from a generator seeded
by (seed, index of the token being sampled), so its tokens depend only on its own seed and
logits: not on which other requests share the batch, and not on whether its prefill ran on
another engine (the prompt/token split gives the same tokens as one engine). Requests without a
seed draw from the engine's generator (seeded by the engine's `seed`).

Any finite logits and any valid parameters give an in-vocabulary token of nonzero probability:
parameters are clamped in Python before they become tensors, each row's best logit is moved to 0
before the temperature divides it (so softmax never sees inf - inf), and processed logits are
clamped to float32's finite range.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ..errors import UserError
from .logprobs import MAX_LOGPROBS

SAMPLING_EPS = 1e-5  # temperatures below this are greedy (vLLM's _SAMPLING_EPS)
MAX_LOGIT_BIAS = 100.0  # |bias| limit, as in OpenAI's API
MAX_PENALTY = 2.0  # |presence_penalty| and |frequency_penalty| limit, as in OpenAI's API
F32 = torch.finfo(torch.float32)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # below SAMPLING_EPS: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off (as are values >= the vocabulary size)
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings (need a tokenizer); the text is cut before them
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    return_logits: bool = False  # keep each sampled step's raw logits (float32, CPU) in the output
    presence_penalty: float = 0.0  # subtracted once from each token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence of each token already generated
    repetition_penalty: float = 1.0  # divides positive, multiplies negative logits of prompt and output tokens
    # (token id, bias) pairs sorted by token id, added to the logits; a dict is accepted. The
    # engine checks the ids against its vocabulary.
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None         # each generated token's logprob and the N most likely (logprobs.py)
    prompt_logprobs: int | None = None  # each prompt token's logprob and the N most likely there
    grammar: str | None = None          # an llguidance grammar its output must follow (structured.py)
    min_p: float = 0.0       # sampled rows keep the tokens of at least min_p x the best one's probability
    min_tokens: int = 0      # no EOS, stop token or stop string ends the output before this many tokens

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise UserError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise UserError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise UserError(f"top_k must be >= -1 (0 and -1 mean off), got {self.top_k}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY:
                raise UserError(f"{name} must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], "
                                f"got {getattr(self, name)}")
        if not 0.0 <= self.min_p <= 1.0:
            raise UserError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise UserError(f"min_tokens must be in [0, max_tokens ({self.max_tokens})], got {self.min_tokens}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise UserError(f"repetition_penalty must be finite and > 0, got {self.repetition_penalty}")
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and not 0 <= n <= MAX_LOGPROBS:
                raise UserError(f"{name} must be in [0, {MAX_LOGPROBS}], got {n}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def penalized(self) -> bool:
        """Uses a presence, frequency or repetition penalty."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


def _logit_bias(bias: Mapping[int, float] | tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
    """`bias` as (token id, float bias) pairs sorted by token id (the last one wins for a repeated
    id); UserError for a pair that is not an integer id >= 0 and a bias in [-100, 100]."""
    out: dict[int, float] = {}
    for pair in bias.items() if isinstance(bias, Mapping) else bias:
        try:
            tok, b = operator.index(pair[0]), float(pair[1])
            ok = len(pair) == 2 and tok >= 0 and -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS
        except (TypeError, ValueError, IndexError):
            ok = False
        if not ok:
            raise UserError(f"logit_bias maps token ids (integers >= 0) to biases in "
                            f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]; got {pair!r}")
        out[tok] = b
    return tuple(sorted(out.items()))


class Row(Protocol):
    """What the sampler reads of a request (a `Sequence` is one): its parameters and its tokens
    so far. `len(output_ids)` is the index of the token being sampled."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]


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


def _counts(ids: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """(len(ids), vocab) float counts of each row's token ids."""
    width = max(map(len, ids), default=0)
    padded = torch.tensor([r + [vocab] * (width - len(r)) for r in ids], dtype=torch.long,
                          device=device).view(len(ids), width)  # `vocab` pads: a column dropped below
    counts = torch.zeros(len(ids), vocab + 1, device=device)
    return counts.scatter_add_(1, padded, torch.ones(padded.shape, device=device))[:, :vocab]


def apply_bias(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """`logits` (float32) with each row's `logit_bias` added (a new tensor)."""
    rows = [i for i, p in enumerate(params) for _ in p.logit_bias]
    toks = [t for p in params for t, _ in p.logit_bias]
    bias = torch.tensor([b for p in params for _, b in p.logit_bias], device=logits.device)
    lt = lambda x: torch.tensor(x, dtype=torch.long, device=logits.device)  # noqa: E731
    return logits.index_put((lt(rows), lt(toks)), bias, accumulate=True)


def apply_penalties(logits: torch.Tensor, rows: Sequence[Row]) -> torch.Tensor:
    """`logits` (float32) with each row's repetition penalty (over its prompt and output tokens),
    then frequency and presence penalties (over its output tokens) applied (a new tensor). Only
    the penalized rows are touched; the result is clamped to float32's finite range."""
    which = [i for i, r in enumerate(rows) if r.params.penalized]
    dev, vocab = logits.device, logits.shape[1]
    params = [rows[i].params for i in which]
    x = logits[which]
    out = _counts([rows[i].output_ids for i in which], vocab, dev)
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = (out + _counts([rows[i].prompt_ids for i in which], vocab, dev)) > 0
        # a penalty beyond float32's range acts as its extreme (never 0 or inf: no 0 * inf)
        rp = torch.tensor([p.repetition_penalty for p in params], device=dev).clamp(F32.tiny, F32.max)
        x = torch.where(seen, torch.where(x > 0, x / rp[:, None], x * rp[:, None]), x)
    freq = torch.tensor([p.frequency_penalty for p in params], device=dev)[:, None]
    pres = torch.tensor([p.presence_penalty for p in params], device=dev)[:, None]
    x = (x - freq * out - pres * (out > 0)).clamp(-F32.max, F32.max)
    return logits.index_copy(0, torch.tensor(which, dtype=torch.long, device=dev), x)


def mask_stops(logits: torch.Tensor, rows: Sequence[Row], eos_ids: Sequence[int]) -> torch.Tensor:
    """`logits` (float32) with the EOS and stop token ids of each row short of its `min_tokens`
    set to -inf (a new tensor; EOS left alone where the row ignores it)."""
    idx = [(i, t) for i, r in enumerate(rows) if len(r.output_ids) < r.params.min_tokens
           for t in {*r.params.stop_token_ids, *(() if r.params.ignore_eos else eos_ids)} if t < logits.shape[1]]
    if not idx:
        return logits
    lt = torch.tensor(idx, dtype=torch.long, device=logits.device)
    return logits.index_put((lt[:, 0], lt[:, 1]), torch.tensor(float("-inf"), device=logits.device))


def _short(r: Row) -> bool:
    """Whether row `r` has made fewer tokens than its min_tokens."""
    return len(r.output_ids) < r.params.min_tokens


class Sampler:
    def __init__(self, device: str | torch.device, seed: int = 0, eos_ids: Sequence[int] = ()) -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.eos_ids = tuple(eos_ids)   # masked while a row is short of its min_tokens (mask_stops)

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor, rows: Sequence[Row]) -> list[int]:
        """One token per row of `logits` (B, vocab); `rows[i]` is the request of row i (its
        parameters, and its prompt and output tokens for the penalties and the seed's index).
        `logits` is not modified."""
        params = [r.params for r in rows]
        processed = [p for p in params if p.logit_bias or p.penalized]
        short = any(map(_short, rows))
        if not processed and not short and all(p.greedy for p in params):
            return logits.argmax(-1).tolist()
        logits = logits.float()
        if any(p.logit_bias for p in processed):
            logits = apply_bias(logits, params)
        if short:
            logits = mask_stops(logits, rows, self.eos_ids)
        if any(p.penalized for p in processed):
            logits = apply_penalties(logits, rows)
        greedy = logits.argmax(-1)
        if all(p.greedy for p in params):
            return greedy.tolist()
        is_greedy = torch.tensor([p.greedy for p in params], device=logits.device)
        return torch.where(is_greedy, greedy, self._sample(logits, rows)).tolist()

    def _sample(self, logits: torch.Tensor, rows: Sequence[Row]) -> torch.Tensor:
        """A token per row drawn at the row's temperature from its top-k / top-p nucleus (greedy
        rows draw nothing; their result is ignored)."""
        params = [r.params for r in rows]
        dev, vocab = logits.device, logits.shape[1]
        # greedy rows get temperature 1; a temperature beyond float32's range acts as its largest value
        temp = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=dev)
        temp = temp.clamp(max=F32.max)
        x = (logits - logits.amax(-1, keepdim=True)) / temp[:, None]  # each row's best is 0: no inf - inf
        if any(p.min_p > 0 for p in params):  # p_i >= min_p * p_best, i.e. x_i >= log(min_p) (x_best = 0)
            floor = torch.tensor([math.log(p.min_p) if p.min_p > 0 else -math.inf for p in params], device=dev)
            x = x.masked_fill(x < floor[:, None], float("-inf"))
        top_k = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]  # Python ints, clamped before torch
        if any(top_k) or any(p.top_p < 1 for p in params):
            top_p = torch.tensor([p.top_p for p in params], device=dev)
            x = filter_logits(x, torch.tensor(top_k, device=dev), top_p)
        probs = x.softmax(-1)
        noise = torch.ones_like(probs)
        unseeded = [i for i, p in enumerate(params) if p.seed is None and not p.greedy]
        if unseeded:
            noise[unseeded] = torch.empty(len(unseeded), vocab, device=dev).exponential_(
                generator=self.generator)
        for i, r in enumerate(rows):
            if r.params.seed is not None and not r.params.greedy:
                g = torch.Generator(device=dev).manual_seed(_mix(r.params.seed, len(r.output_ids)))
                noise[i].exponential_(generator=g)
        # a zero draw would make 0 / 0 = NaN, which argmax would pick over every real token
        return (probs / noise.clamp_(min=F32.tiny)).argmax(-1)
