"""What a worker runs: its engine, built from its command line (worker_args.py), and a request's
sampling parameters, turned from the wire's `WireParams` into the engine's SamplingParams.

A worker at --tp N is a group of N processes: its engine spawns the N-1 followers and joins them
(engine/engine.py), and stops them when it closes or this process dies.

An echo worker (--worker-mode echo) runs serve/echo.py's stand-in and never imports torch; it
ignores --tp (one process, no device)."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import TYPE_CHECKING

from .messages import WireParams

if TYPE_CHECKING:
    from ..engine.contract import Engine


def build_engine(args, kv_alloc=None) -> Engine:
    """The engine of a worker with options `args`; `kv_alloc` allocates its KV cache (a shared
    region for same-host peers, shm.py) where given."""
    if args.worker_mode == "echo":
        from .echo import EchoEngine
        return EchoEngine(token_delay_s=args.echo_token_delay_s)
    if args.cpus:
        os.sched_setaffinity(0, args.cpus)
    import torch

    from ..engine.engine import EngineConfig, LLMEngine
    torch.set_num_threads(max(1, args.threads))
    engine = LLMEngine(args.model, EngineConfig(device=args.device, dtype=args.dtype, seed=args.seed,
                                                num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
                                                batching=args.policy.batching, tokenizer=None,
                                                cuda_graphs=args.cuda_graphs, tp=args.tp, kernels=args.kernels,
                                                prefix_caching=args.prefix_caching), kv_alloc=kv_alloc)
    if args.debug_fail_token is not None:
        fail_on_token(engine, args.debug_fail_token)
    return engine


def sampling_params(p: WireParams, echo: bool = False):
    """The engine's SamplingParams of `p` (UserError where the engine refuses them). The echo
    stand-in reads max_tokens only (and importing the sampler would import torch)."""
    if echo:
        return SimpleNamespace(max_tokens=p.max_tokens)
    from ..engine.sampler import SamplingParams
    return SamplingParams(max_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
                          seed=p.seed, stop_token_ids=tuple(p.stop_token_ids), ignore_eos=p.ignore_eos,
                          presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
                          repetition_penalty=p.repetition_penalty, logit_bias=tuple(p.logit_bias),
                          logprobs=p.logprobs, prompt_logprobs=p.prompt_logprobs, grammar=p.grammar,
                          min_p=p.min_p, min_tokens=p.min_tokens)


def item_logprobs(o) -> list | None:
    """An output's logprob records for `out`: [its new tokens' records, its prompt's records with
    its first output token only], each None where not asked; None when neither is."""
    if o.logprobs is None and o.prompt_logprobs is None:
        return None
    first = len(o.token_ids) == len(o.new_token_ids)  # a token worker's outputs start after the first
    return [o.logprobs[len(o.logprobs) - len(o.new_token_ids):] if o.logprobs is not None else None,
            o.prompt_logprobs if first and o.prompt_logprobs is not None else None]


def fail_on_token(engine, token: int) -> None:
    """Tests only (--debug-fail-token): the model's first layer raises in any step that holds a
    prompt with `token` (a stand-in for an input that breaks the engine, to exercise the
    router's quarantine)."""
    def hook(module, args):
        if any(token in seq.prompt_ids for seq, _ in engine.current_batch):
            raise RuntimeError(f"debug: a prompt holds token {token}")

    engine.model.layers[0].register_forward_pre_hook(hook)
