"""TetriInfer's instance flip live (`serve --policy tetriinfer`, policy/instance_flip.py): a load
shift makes workers flip role while requests are in flight, and nothing is lost: greedy tokens
equal LLMEngine.generate token for token, and no KV block leaks.

2 prompt + 2 token workers, --flip-idle-s 0 (a worker flips at the first 0.1 s sample that finds
it idle while every worker of the other role has load, once it holds nothing). Phase 1, heavy
prefill: long prompts with one output token (each runs whole on a prompt worker): the token
workers idle, so one flips to prompt (one token worker always stays). Phase 2, heavy decode:
short prompts with long outputs, while phase 1's tail still runs: prompt workers go idle while
the token workers decode, so some flip to token."""

from __future__ import annotations

import asyncio
import random

import httpx

from .conftest import complete, reference


def phases(seed: int = 36):
    rng = random.Random(seed)
    heavy_prefill = [([rng.randrange(3, 259) for _ in range(rng.randrange(300, 480))], 1) for _ in range(120)]
    heavy_decode = [([rng.randrange(3, 259) for _ in range(rng.randrange(2, 12))], rng.randrange(250, 480))
                    for _ in range(24)]
    return heavy_prefill, heavy_decode


async def run(url: str, heavy_prefill, heavy_decode):
    async with httpx.AsyncClient(timeout=120) as client:
        first = [asyncio.create_task(complete(client, url, p, m, stream=i % 2 == 0, ignore_eos=True))
                 for i, (p, m) in enumerate(heavy_prefill)]
        await asyncio.sleep(0.5)
        second = [asyncio.create_task(complete(client, url, p, m, stream=i % 2 == 1, ignore_eos=True))
                  for i, (p, m) in enumerate(heavy_decode)]
        return await asyncio.gather(*first, *second)


def test_flips_under_a_load_shift_lose_nothing(server_factory, reference_engine):
    srv = server_factory("--policy", "tetriinfer", "--prompt-workers", "2", "--token-workers", "2",
                         "--flip-idle-s", "0")
    heavy_prefill, heavy_decode = phases()
    reqs = heavy_prefill + heavy_decode
    want = reference(reference_engine, [p for p, _ in reqs], [m for _, m in reqs], ignore_eos=True)
    res = asyncio.run(run(srv.url, heavy_prefill, heavy_decode))
    for i, ((status, toks, body), w) in enumerate(zip(res, want)):
        assert status == 200, body
        assert toks == w, f"request {i}: {toks} != {w}"
    st = srv.wait_settled()
    for w in st["workers"]:
        assert w["up"] and w["free"] == w["start_free"] and w["reserved"] == 0, w
    flips = st["flips"]
    assert {f["to"] for f in flips} == {"prompt", "token"}, flips
    assert any(f["in_flight"] for f in flips), flips     # requests ran on the others meanwhile
    roles = [m["pool"] for m in st["machines"]]
    assert roles.count("prompt") >= 1 and roles.count("token") >= 1 and len(roles) == 4
    assert srv.metric("splitserve_instance_flips_total") == len(flips)
