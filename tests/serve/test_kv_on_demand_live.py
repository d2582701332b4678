"""Serving with KV allocated on demand (`serve`'s default) is lossless under memory pressure: 40
concurrent greedy requests on workers of 24 KV blocks (384 tokens), where decodes run out of
blocks and preempt one another, get exactly LLMEngine.generate's tokens; preemptions happen
(counted), every block comes back and the router's view ends idle. Unsplit and split, over tcp and
local (shared memory) KV transports, a token pool at tensor parallel 2; the split ones send a
preempted decode back through the prompt pool to be recomputed (`--recompute auto`), one
recomputes it in place."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from .conftest import complete, reference

CONFIGS = {   # the split ones recompute through the prompt pool (--recompute auto), but split-in-place
    "unsplit": ("--design", "baseline", "--mixed-workers", "1"),
    "split-tcp": ("--prompt-workers", "1", "--token-workers", "1", "--transport", "tcp"),
    "split-local": ("--prompt-workers", "1", "--token-workers", "1", "--transport", "local"),
    "split-token-tp2": ("--prompt-workers", "1", "--token-workers", "1", "--token-tp", "2"),
    "split-in-place": ("--prompt-workers", "1", "--token-workers", "1", "--recompute", "in-place"),
}


def workload(n: int = 40, seed: int = 42):
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 259) for _ in range(rng.choice([3, 9, 17, 33, 60]))] for _ in range(n)]
    return prompts, [rng.choice([24, 40, 64]) for _ in range(n)]


async def serve_all(url: str, prompts, max_tokens) -> list[list[int]]:
    async with httpx.AsyncClient(timeout=120) as client:
        res = await asyncio.gather(*(complete(client, url, p, m, stream=i % 2 == 0, ignore_eos=True)
                                     for i, (p, m) in enumerate(zip(prompts, max_tokens))))
    for status, _, body in res:
        assert status == 200, body
    return [toks for _, toks, _ in res]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_decodes_preempted_for_blocks_lose_no_token(config, server_factory, reference_engine):
    srv = server_factory(*CONFIGS[config], "--num-blocks", "24")
    prompts, max_tokens = workload()
    want = reference(reference_engine, prompts, max_tokens, ignore_eos=True)
    got = asyncio.run(serve_all(srv.url, prompts, max_tokens))
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"{config}: request {i} ({len(prompts[i])} prompt tokens): {g} != {w}"
    preempted = srv.metric("vllm:num_preemptions_total")
    assert preempted > 0, "the cache is small enough that decodes run out of blocks"
    where = {w: srv.metric("splitserve_recomputes_total", where=w) for w in ("in_place", "prompt_pool")}
    assert sum(where.values()) == preempted
    if config in ("unsplit", "split-in-place"):
        assert where["prompt_pool"] == 0
    else:   # the token worker's decodes go back; a borrowed prompt worker's (prompt and decode there) stay
        assert where["prompt_pool"] > 0
    st = srv.wait_settled()
    for w in st["workers"]:
        assert w["free"] == w["start_free"] == 24 and w["reserved"] == 0, w
    assert st["policy_idle"], st["machines"]
