"""Prefix caching live (issue 28): a Splitwise 1P + 1T `serve --model tiny` with the workers'
prefix caches on (the default).

- Two requests sharing a prefix, one after the other, through the official `openai` client: the
  second's `usage.prompt_tokens_details.cached_tokens` is the shared prefix in whole 16-token
  blocks, vLLM's `vllm:prefix_cache_queries` / `vllm:prefix_cache_hits` count both prompts and
  that hit, and both answers are the engine's greedy tokens.
- 40 conversations of 3 turns at once (each turn's prompt is the history so far: the previous
  prompt, its answer and a new question): every answer equals the engine's greedy tokens for
  the same history, the prompt worker's cache is hit, and every block comes back."""

from __future__ import annotations

import asyncio
import random

import httpx
import openai
import pytest

from .conftest import complete, reference


def test_a_shared_prefix_is_reported_cached(server_factory, reference_engine):
    srv = server_factory("--prompt-workers", "1", "--token-workers", "1")
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.api_key or "none", max_retries=0)
    rng = random.Random(3)
    shared = [1] + [rng.randrange(3, 259) for _ in range(70)]          # 71 tokens: 4 full blocks of 16
    prompts = [shared + [rng.randrange(3, 259) for _ in range(20)] for _ in range(2)]
    got = []
    for p in prompts:
        r = client.completions.create(model="tiny", prompt=p, max_tokens=6, temperature=0,
                                      extra_body={"ignore_eos": True})
        got.append((r.choices[0].model_extra["token_ids"], r.usage.prompt_tokens_details.cached_tokens))
    assert [c for _, c in got] == [0, 64]
    assert [t for t, _ in got] == reference(reference_engine, prompts, [6, 6], ignore_eos=True)
    assert srv.metric("vllm:prefix_cache_queries_total") == 2 * 91
    assert srv.metric("vllm:prefix_cache_hits_total") == 64


def test_forty_conversations_at_once_are_lossless(server_factory, reference_engine):
    srv = server_factory("--prompt-workers", "1", "--token-workers", "1")
    rng = random.Random(6)
    convs = [([1] + [rng.randrange(3, 259) for _ in range(rng.choice([20, 40, 60]))],
              [[rng.randrange(3, 259) for _ in range(rng.choice([5, 12, 20]))] for _ in range(2)]) for _ in range(40)]

    def history(first, asks, answers):
        h = list(first)
        for ask, ans in zip(asks, answers):
            h += ans + ask
        return h

    async def talk(client, first, asks):
        answers = []
        for turn in range(3):
            status, toks, body = await complete(client, srv.url, history(first, asks, answers), 6, turn % 2 == 0,
                                                srv.headers, ignore_eos=True)
            assert status == 200, body
            answers.append(toks)
        return answers

    async def all_of_them():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(talk(client, f, a) for f, a in convs))

    live = asyncio.run(all_of_them())
    for (first, asks), answers in zip(convs, live):
        want = []
        for turn in range(3):
            want += reference(reference_engine, [history(first, asks, want)], [6], ignore_eos=True)
        assert answers == want
    assert srv.metric("vllm:prefix_cache_hits_total") > 0
    assert srv.metric("splitserve_kv_transfer_failures_total") == 0
    for w in srv.state()["workers"]:  # every block back (a cached block counts as free)
        assert w["free"] == w["blocks"], w


@pytest.mark.parametrize("own", [False, True], ids=["tcp-layerwise", "local-serialized"])
def test_the_token_worker_keeps_a_conversations_earlier_turn(server_factory, split_server, reference_engine, own):
    """Turn 1: 40 prompt tokens, 10 out, decoded on the token worker, which computed positions
    0..48: 3 full blocks (48 tokens) stay in its cache. Turn 2 (turn 1, its answer, 12 new tokens:
    62) reserves them there, so the hand-over skips 48 tokens; the prompt worker's cache gives it
    turn 1's 2 full blocks (32 tokens). Both answers are the engine's. On the session's 1P + 1T
    server (tcp, layer by layer) and on one of --transport local with serialized transfers."""
    srv = server_factory("--prompt-workers", "1", "--token-workers", "1", "--transport", "local",
                         "--layerwise-threshold", "1000000") if own else split_server
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.api_key or "none", max_retries=0)
    rng = random.Random(9)
    turn1 = [1] + [rng.randrange(3, 259) for _ in range(39)]
    ask = [rng.randrange(3, 259) for _ in range(12)]
    before = [srv.metric("splitserve_kv_transfer_skipped_tokens_total"), srv.metric("vllm:prefix_cache_hits_total")]
    answers = []
    for prompt in (turn1, None):
        prompt = prompt or turn1 + answers[0] + ask
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0,
                                      extra_body={"ignore_eos": True})
        answers.append(r.choices[0].model_extra["token_ids"])
        assert answers[-1] == reference(reference_engine, [prompt], [10], ignore_eos=True)[0]
    assert srv.metric("splitserve_kv_transfer_skipped_tokens_total") - before[0] == 48
    assert srv.metric("vllm:prefix_cache_hits_total") - before[1] == 32
    st = srv.wait_settled()
    assert all(w["free"] == w["blocks"] for w in st["workers"]), st["workers"]
