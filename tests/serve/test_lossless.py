"""Split serving is lossless: greedy tokens of 1+1 and 2+2 prompt/token clusters, with KV moved
layer by layer or in one shot, equal single-worker serving and LLMEngine.generate token for token,
for dozens of concurrent requests of mixed sizes. No KV block leaks afterwards."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest

from .conftest import complete, reference


def workload(n: int = 36, seed: int = 7):
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 259) for _ in range(rng.choice([1, 3, 9, 17, 33, 70, 130]))] for _ in range(n)]
    max_tokens = [rng.choice([1, 2, 5, 12, 24]) for _ in range(n)]
    return prompts, max_tokens


async def serve_all(url: str, prompts, max_tokens, headers=None) -> list[list[int]]:
    async with httpx.AsyncClient(timeout=60) as client:
        res = await asyncio.gather(*(complete(client, url, p, m, stream=i % 2 == 0, headers=headers, ignore_eos=True)
                                     for i, (p, m) in enumerate(zip(prompts, max_tokens))))
    for status, toks, body in res:
        assert status == 200, body
    return [toks for _, toks, _ in res]


def assert_serves_like_generate(srv, engine, prompts, max_tokens, label: str = "") -> None:
    """Every prompt served concurrently by `srv` (greedy, ignore_eos) gets exactly the tokens of
    LLMEngine.generate on `engine`."""
    want = reference(engine, prompts, max_tokens, ignore_eos=True)
    assert all(len(w) == m for w, m in zip(want, max_tokens))
    got = asyncio.run(serve_all(srv.url, prompts, max_tokens, srv.headers))
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"{label}request {i} ({len(prompts[i])} prompt tokens): {g} != {w}"


@pytest.mark.parametrize("cluster", ["split_server", "split_2x2_server", "single_server"])
def test_split_equals_single_worker_and_engine(cluster, request, reference_engine):
    srv = request.getfixturevalue(cluster)
    mode = {"split_server": "layerwise", "split_2x2_server": "serialized"}.get(cluster)
    prompts, max_tokens = workload()
    before = {k: srv.metric("splitserve_kv_transfers_total", mode=k) for k in ("layerwise", "serialized")}
    nbytes = srv.metric("splitserve_kv_transfer_bytes_total", mode=mode) if mode else 0.0

    assert_serves_like_generate(srv, reference_engine, prompts, max_tokens, f"{cluster}: ")

    after = {k: srv.metric("splitserve_kv_transfers_total", mode=k) for k in ("layerwise", "serialized")}
    if mode is None:
        assert after == before == {"layerwise": 0, "serialized": 0}
    else:
        other = "serialized" if mode == "layerwise" else "layerwise"
        assert after[mode] - before[mode] == sum(m > 1 for m in max_tokens)  # one-token requests stay put
        assert after[other] == before[other]
        # tiny: 2 layers x (K, V) x 2 KV heads x 16 dims x 4 bytes = 512 bytes per prompt token
        moved = srv.metric("splitserve_kv_transfer_bytes_total", mode=mode) - nbytes
        assert moved == 512 * sum(len(p) for p, m in zip(prompts, max_tokens) if m > 1)
        assert srv.metric("splitserve_kv_transfer_seconds_total", mode=mode) > 0
    st = srv.wait_settled()
    for w in st["workers"]:
        assert w["free"] == w["start_free"] and w["reserved"] == 0, w
    assert st["policy_idle"], st["machines"]
    if cluster == "split_2x2_server":  # JSQ on pending tokens spread the prompts over both prompt workers
        assert all(w["up"] for w in st["workers"])


def test_server_matches_generate_cli(split_server, capsys):
    from splitserve.cli import main

    # on the server's device (cpu): a preset's random weights are drawn on the device it runs on
    assert main(["generate", "--model", "tiny", "--prompt-ids", "1,2,3", "--max-tokens", "8", "--json",
                 "--device", "cpu"]) == 0
    want = json.loads(capsys.readouterr().out)
    r = httpx.post(split_server.url + "/v1/completions", headers=split_server.headers,
                   json={"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 8, "temperature": 0}, timeout=30)
    body = r.json()
    assert body["choices"][0]["token_ids"] == want["token_ids"]
    assert body["choices"][0]["text"] == want["text"]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": len(want["token_ids"]),
                             "total_tokens": 3 + len(want["token_ids"]), "prompt_tokens_details": {"cached_tokens": 0}}


@pytest.mark.parametrize("limit", [3, 0])
def test_mixed_worker_preempts_decodes_for_prompts_without_changing_tokens(limit, server_factory, reference_engine):
    """KV reserved (--kv-allocation reserve): one mixed worker whose cache (40 blocks of 16 tokens)
    one long request mostly fills: the prompts that arrive while it decodes need 9 blocks where 8
    are free, so the machine-level policy preempts it (it is recomputed to the same tokens), at
    most --preemption-limit times. With --preemption-limit 0 the prompts wait for it instead, and
    nothing is preempted. (On demand a prompt never preempts: test_kv_on_demand_live.py.)"""
    srv = server_factory("--design", "baseline", "--mixed-workers", "1", "--num-blocks", "40",
                         "--preemption-limit", str(limit), "--kv-allocation", "reserve")
    long_prompt, long_out = [(7 * i) % 250 + 3 for i in range(20)], 480       # 500 tokens: 32 of 40 blocks
    rng = random.Random(12)
    prompts = [[rng.randrange(3, 259) for _ in range(130)] for _ in range(4)]  # 138 tokens: 9 blocks each
    max_tokens = [8] * 4
    want = reference(reference_engine, [long_prompt, *prompts], [long_out, *max_tokens], ignore_eos=True)

    async def run():
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"prompt": long_prompt, "max_tokens": long_out, "temperature": 0, "stream": True,
                    "ignore_eos": True}
            toks: list[int] = []
            others = None
            async with client.stream("POST", srv.url + "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    for c in json.loads(line[6:])["choices"]:
                        toks += c["token_ids"]
                    if toks and others is None:  # it decodes now: the others arrive
                        others = asyncio.create_task(serve_all(srv.url, prompts, max_tokens))
            return [toks, *await others]

    assert asyncio.run(run()) == want
    st = srv.wait_settled()
    (w,) = st["workers"]
    assert w["free"] == w["start_free"] == 40 and w["reserved"] == 0
    if limit:
        assert 0 < w["preempted"], "the prompts lacked KV while the long request decoded"
    else:
        assert w["preempted"] == 0
    assert st["policy_idle"]
