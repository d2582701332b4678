"""Aladdin live (`serve --policy aladdin`, policy/aladdin.py): the router stops routing to workers
it scales down and routes to them again when the rate comes back; the scaled-down workers stay up
(warm standby) and nothing is lost: greedy tokens equal LLMEngine.generate token for token, and
no KV block leaks.

4 mixed workers of 48 blocks, --scale-window 2 (the heartbeat is 1 s): a burst of 60 requests;
then no arrivals until the window is empty (a few heartbeats): one worker takes new requests (Eq. 7
at rate 0 keeps one), the others drained, up but taking nothing; then a second burst, during which
the placement opens bins again (a request that fits no active worker brings one back)."""

from __future__ import annotations

import asyncio
import random
import time

import httpx

from .conftest import complete, reference


def burst(n: int, seed: int):
    rng = random.Random(seed)
    return [([rng.randrange(3, 259) for _ in range(rng.choice([3, 9, 33, 70, 130]))], rng.choice([2, 12, 24, 40]))
            for _ in range(n)]


async def run(srv, reqs) -> tuple[list, int]:
    """The requests at once; meanwhile the most workers taking new requests at any sample."""
    async with httpx.AsyncClient(timeout=120) as client:
        tasks = [asyncio.create_task(complete(client, srv.url, p, m, stream=i % 2 == 0, ignore_eos=True))
                 for i, (p, m) in enumerate(reqs)]
        most = 0
        while not all(t.done() for t in tasks):
            st = (await client.get(srv.url + "/debug/state", headers=srv.headers)).json()
            most = max(most, sum(m["accepting"] for m in st["machines"]))
            await asyncio.sleep(0.02)
        return await asyncio.gather(*tasks), most


def accepting(srv) -> list[bool]:
    return [m["accepting"] for m in srv.state()["machines"]]


def test_scaled_down_workers_stay_up_and_come_back(server_factory, reference_engine):
    srv = server_factory("--policy", "aladdin", "--prompt-workers", "2", "--token-workers", "2",
                         "--num-blocks", "48", "--scale-window", "2")
    first, second = burst(60, 1), burst(60, 2)
    want = reference(reference_engine, [p for p, _ in first + second], [m for _, m in first + second],
                     ignore_eos=True)
    res1, _ = asyncio.run(run(srv, first))
    deadline = time.monotonic() + 10
    while sum(accepting(srv)) > 1 and time.monotonic() < deadline:   # the window empties: 1 worker
        time.sleep(0.2)
    assert sum(accepting(srv)) == 1
    st = srv.wait_settled()
    assert all(w["up"] for w in st["workers"]) and len(st["workers"]) == 4   # warm standby
    res2, most = asyncio.run(run(srv, second))
    assert most > 1                    # scaled-down workers took requests again
    for i, ((status, toks, body), w) in enumerate(zip(res1 + res2, want)):
        assert status == 200, body
        assert toks == w, f"request {i}: {toks} != {w}"
    st = srv.wait_settled()
    for w in st["workers"]:
        assert w["up"] and w["free"] == w["start_free"] and w["reserved"] == 0, w
    assert st["policy_idle"], st["machines"]
