"""Splitwise's mixed pool live under the authors' borrowing rule (the default; policy/pools.py):
1 prompt + 1 token worker with --prompt-queue-threshold 1, so the prompt worker counts as full
as soon as a prompt waits there and the router borrows the token worker (its only one) into the
mixed pool, then the prompt worker when the token side is full; requests then prefill on the
token worker and decode on the prompt worker, or run whole on one. Nothing is lost: greedy
tokens equal LLMEngine.generate token for token, no KV block leaks, every machine goes home once
idle, and /metrics counts the borrowings the router made (splitserve_machines_borrowed_total,
the simulator's `borrowed_into_mixed_pool`)."""

from __future__ import annotations

import asyncio
import random

import httpx

from .conftest import complete, reference


def requests(seed: int = 5, n: int = 40):
    rng = random.Random(seed)
    return [([rng.randrange(3, 259) for _ in range(rng.randrange(40, 300))], rng.randrange(4, 40)) for _ in range(n)]


async def run(url: str, reqs):
    async with httpx.AsyncClient(timeout=120) as client:
        return await asyncio.gather(*(complete(client, url, p, m, stream=i % 2 == 0, ignore_eos=True)
                                      for i, (p, m) in enumerate(reqs)))


def test_borrowed_machines_lose_nothing_and_are_counted(server_factory, reference_engine):
    srv = server_factory("--prompt-workers", "1", "--token-workers", "1", "--prompt-queue-threshold", "1")
    reqs = requests()
    want = reference(reference_engine, [p for p, _ in reqs], [m for _, m in reqs], ignore_eos=True)
    res = asyncio.run(run(srv.url, reqs))
    for i, ((status, toks, body), w) in enumerate(zip(res, want)):
        assert status == 200, body
        assert toks == w, f"request {i}: {toks} != {w}"
    st = srv.wait_settled()
    for w in st["workers"]:
        assert w["up"] and w["free"] == w["start_free"] and w["reserved"] == 0, w
    assert [(m["home"], m["pool"]) for m in st["machines"]] == [("prompt", "prompt"), ("token", "token")]
    assert srv.metric("splitserve_machines_borrowed_total") >= 1
