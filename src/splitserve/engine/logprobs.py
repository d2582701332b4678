"""Log-probabilities, as vLLM reports them: of the model's raw logits (before any bias, penalty,
temperature or top-k/top-p), in float32.

- `logprobs=N` (SamplingParams): each generated token's log-probability, and the N most likely
  tokens at its step (N = 0: the chosen token's only).
- `prompt_logprobs=N`: for each prompt position after the first, the log-probability of the
  prompt's token there given the tokens before it, and the N most likely at that position (the
  first position has none: nothing comes before it). Such a prompt is computed whole, never
  taken from the prefix cache, since its cached positions have no logits.

A record is `(token, logprob, rank, top)`: rank is 1 for the most likely token; `top` the N most
likely as (token, logprob), most likely first.
"""

from __future__ import annotations

import torch

MAX_LOGPROBS = 20  # vLLM's default max_logprobs

Record = tuple[int, float, int, list[tuple[int, float]]]


def records(logits: torch.Tensor, tokens: list[int], n: int) -> list[Record]:
    """One record per row of `logits` (rows, vocab) for the token of that row."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)  # log-softmax = x - lse, never materialised whole
    chosen = x.gather(1, torch.tensor(tokens, device=x.device)[:, None])
    ranks = (x > chosen).sum(-1) + 1
    if n:
        vals, ids = x.topk(n, dim=-1)
        tops = [list(zip(i, v)) for i, v in zip(ids.tolist(), (vals - lse).tolist())]
    else:
        tops = [[] for _ in tokens]
    return list(zip(tokens, (chosen - lse)[:, 0].tolist(), ranks.tolist(), tops))


def handed(seq) -> list | None:
    """What goes with a prefill-only sequence's first token to where it decodes: [that token's
    record, the prompt's records], each None where not asked; None when neither is."""
    if seq.params.logprobs is None and seq.params.prompt_logprobs is None:
        return None
    return [seq.logprobs[-1:] if seq.params.logprobs is not None else None,
            seq.prompt_logprobs if seq.params.prompt_logprobs is not None else None]


def prompt_positions(seq, n: int) -> range:
    """The positions of `seq`'s next `n` tokens (from its num_computed) whose logits score a prompt
    token not scored yet (position q scores the prompt's token q + 1)."""
    c = seq.num_computed
    return range(max(c, len(seq.prompt_logprobs)), min(c + n, len(seq.prompt_ids) - 1))


def score_prompts(scored: list, logits: torch.Tensor) -> None:
    """Append to each sequence of `scored` ((sequence, positions) in row order) the records of its
    positions' rows of `logits`."""
    i = 0
    for seq, qs in scored:
        if len(qs):
            seq.prompt_logprobs += records(logits[i:i + len(qs)], [seq.prompt_ids[q + 1] for q in qs],
                                           seq.params.prompt_logprobs)
            i += len(qs)
