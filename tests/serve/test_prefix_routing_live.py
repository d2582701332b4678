"""Prefix-aware routing live: the router's view of each worker's prefix cache (serve/prefix_view.py)
follows what it dispatched and what the workers report, and routing (policy/prefix_routing.py
`pick`, the simulator's rule) sends a request to the worker holding its prompt's prefix.

- The view without processes (serve/cluster_state.py LiveCluster, 2 prompt + 1 token workers,
  blocks of 16 tokens): after a 64-token prompt's first token came back from prompt worker 0, a
  request sharing its first 48 tokens goes to worker 0 although worker 1 has fewer pending tokens,
  as long as the difference is within --prefix-slack; beyond it (or with the slack off) it goes to
  worker 1. The view predicts 48 cached tokens; a report of fewer drops the names from the
  reported block on (the worker had evicted them); a token worker's `reserved` likewise; a
  finished request names its output's blocks on its decoding worker; a dead worker's view is empty.
- Live, on the session's 2P + 2T `serve --model tiny` (prefix caching and --prefix-slack 4096 by
  default), through the official `openai` client: a 64-token prompt, then 3 prompts sharing its
  first 48 tokens sent at once: all 3 report 48 cached tokens (they went where the prefix is; JSQ
  would send the second of them to the other, idle prompt worker while the first is queued), and
  vllm:prefix_cache_hits_total moves by 3 x 48.
"""

from __future__ import annotations

import asyncio
import random

import openai
import pytest

from splitserve.policy.cluster import RoutingConfig
from splitserve.policy.prefix_routing import cache_key
from splitserve.policy.state import Phase, Pool, Request
from splitserve.serve.cluster_state import LiveCluster
from splitserve.serve.config import RequestLimits
from splitserve.serve.openai_io import ModelInfo
from splitserve.serve.schema import prepare

BS = 16


def prompts(seed: int) -> tuple[list[int], list[int]]:
    """A 64-token prompt and another sharing its first 48 tokens (3 blocks), then 16 of its own."""
    rng = random.Random(seed)
    first = [1] + [rng.randrange(3, 259) for _ in range(63)]
    second = first[:48] + [rng.randrange(3, 259) for _ in range(16)]
    assert second[48:] != first[48:]
    return first, second


class View:
    """A LiveCluster of 2 prompt workers (0, 1) and 1 token worker (2), driven as the router drives
    it: arrive, prompt sent, the worker's step report (with what its cache gave), its first token."""

    def __init__(self, slack: int) -> None:
        self.live = LiveCluster([Pool.PROMPT, Pool.PROMPT, Pool.TOKEN], [16 * 1024] * 3, split=True,
                                routing=RoutingConfig(prefix_slack=slack), kv_block=BS, prefix=True)
        self.ids = 0

    def request(self, prompt: list[int], out: int = 8, prefix: bool = True, key: int = -1) -> Request:
        r = Request(self.ids, 0.0, len(prompt), out, cache_key=key)
        self.ids += 1
        if prefix:
            r.blocks = self.live.view.prefix.names(prompt)
        assert self.live.arrive(r)
        return r

    def prefill(self, r: Request, cached: int) -> None:
        """Its prompt is sent, its worker starts it whole (`cached` tokens from its cache) and makes its first token."""
        live, wid = self.live, r.prompt_machine
        live.prefixes.sent(r)
        live.step_started(wid, [(r, r.prompt_tokens)], [], [])
        live.prefixes.reported(wid, r, r.prompt_tokens, cached)
        live.end_step(wid, [(r, 1, False)])
        assert r.phase is Phase.HANDOFF


@pytest.mark.parametrize("slack, load, to", [(4096, 100, 0), (4096, 4096, 0), (4096, 4097, 1), (-1, 100, 1)],
                         ids=["within-slack", "at-slack", "past-slack", "slack-off"])
def test_a_shared_prefix_goes_where_its_blocks_are(slack, load, to):
    first, second = prompts(1)
    v = View(slack)
    r1 = v.request(first)
    assert (r1.prompt_machine, r1.token_machine) == (0, 2)     # both idle: the first of the least loaded
    v.prefill(r1, cached=0)
    p0, p1 = v.live.view.machines[0], v.live.view.machines[1]
    assert p0.cache.match(r1.blocks) == 4 and p1.cache.match(r1.blocks) == 0
    v.request([7] * load, prefix=False)                        # queued on worker 0: it has `load` pending
    assert (p0.pending, p1.pending) == (load, 0)
    r2 = v.request(second)
    assert r2.prompt_machine == to
    v.live.prefixes.sent(r2)
    assert r2.cached == (48 if to == 0 else 0)                 # what the view expects worker `to` to give it


def test_a_prompt_cache_key_goes_to_its_workers_in_the_routers_view():
    # the router's view (LiveCluster) routes through the simulator's schedulers, keys and all: two
    # prompts that share nothing but their key go to one prompt worker while the load allows
    first, second = prompts(4)
    second = [2] + second[1:]                                  # no block in common with `first`
    v = View(4096)
    key = prepare(b'{"prompt": [1], "prompt_cache_key": "conversation 7"}', False, ModelInfo.load("tiny"),
                  RequestLimits()).cache_key
    assert key == cache_key("conversation 7") >= 0
    assert v.request(first, key=key).prompt_machine == 0      # both idle: the first (pending 64, 0)
    v.request([7] * 1000, prefix=False)                        # JSQ: to 1 (64, 1,000)
    v.request([7] * 2000, prefix=False)                        # JSQ: to 0 (2,064, 1,000)
    assert v.request(second, key=key).prompt_machine == 0      # its key's worker, 1,064 past 1 (2,128, 1,000)
    assert v.request(second).prompt_machine == 1               # no key: JSQ, nothing cached matches (2,128, 1,064)
    assert v.request([3] * 4000, key=key, prefix=False).prompt_machine == 0   # 1,064 past 1 (6,128, 1,064)
    assert v.request(second, key=key).prompt_machine == 1      # 5,064 past 1 > 4,096: JSQ, the key follows
    assert v.request(second, key=key).prompt_machine == 1      # (6,128, 1,192): its key's worker now 1


def test_a_report_of_fewer_cached_tokens_drops_the_names():
    first, second = prompts(2)
    v = View(4096)
    r1 = v.request(first)
    v.prefill(r1, cached=0)
    p0 = v.live.view.machines[0]
    r2 = v.request(second)
    assert r2.prompt_machine == 0
    v.live.prefixes.sent(r2)
    assert r2.cached == 48
    v.live.step_started(0, [(r2, 32)], [], [])
    v.live.prefixes.reported(0, r2, 32, 16)                      # a first chunk of 32 tokens attaches 1 block at most
    assert p0.cache.match(r1.blocks) == 4 and r2.cached == 16  # as predicted: nothing stale
    r3 = v.request(second)
    v.live.prefixes.sent(r3)
    v.live.prefixes.reported(0, r3, 64, 16)                      # 1 block where the view said 3: evicted there
    assert p0.cache.match(r1.blocks) == 1 and p0.cache.match(r3.blocks) == 1
    assert r1.blocks[3] in p0.cache.names                      # past the first missing block: unreachable anyway
    r4 = v.request(second)                                     # the view now knows worker 0 holds 1 block of it
    v.live.prefixes.sent(r4)
    assert r4.cached == 16


def test_the_token_worker_view_follows_landings_reservations_and_ends():
    first, second = prompts(3)
    v = View(4096)
    live = v.live
    t = live.view.machines[2]
    r1 = v.request(first, out=20)
    v.prefill(r1, cached=0)
    assert t.cache.match(r1.blocks) == 0
    live.kv_landed(r1)                                         # the KV reached the token worker: it holds the prompt
    assert t.cache.match(r1.blocks) == 4
    live.step_started(2, [], [], [r1])
    live.end_step(2, [(r1, 19, True)])
    assert r1.phase is Phase.DONE
    output = list(range(11, 31))
    live.prefixes.finished(r1, first, output)                    # prompt + 19 outputs: 83 tokens, 5 full blocks
    assert len(t.cache.names) == 5
    assert t.cache.match(live.view.prefix.names(first + output[:16] + [9] * 7)) == 5
    assert live.view.machines[0].cache.match(live.view.prefix.names(first + output[:16])) == 4   # the prompt worker: the prompt
    r2 = v.request(second)
    assert r2.token_machine == 2
    live.prefixes.reserved(r2, 48)                               # as the view predicted: nothing dropped
    assert t.cache.match(r2.blocks) == 3
    live.prefixes.reserved(r2, 16)                               # it held 1 block: the view drops the rest
    assert t.cache.match(r2.blocks) == 1 and t.cache.match(r1.blocks) == 1
    live.view.down(2)                                               # dead: its view is empty, its replacement's too
    assert not t.cache.names
    live.view.up(2)
    assert live.view.machines[2].cache is not None and not live.view.machines[2].cache.names


def test_without_prefix_caching_there_is_no_view():
    live = LiveCluster([Pool.PROMPT, Pool.PROMPT, Pool.TOKEN], [16 * 1024] * 3, split=True, kv_block=BS)
    assert live.view.prefix is None and all(m.cache is None for m in live.view.machines)
    r = Request(0, 0.0, 64, 8)
    live.arrive(r)
    live.prefixes.sent(r)
    assert r.blocks is None and r.cached == 0


def test_three_requests_sharing_a_prefix_go_where_it_is(split_2x2_server):
    srv = split_2x2_server
    srv.wait_settled()
    first, second = prompts(4)
    tails = [second[:48] + [random.Random(i).randrange(3, 259) for _ in range(16)] for i in range(3)]
    hits, queries = srv.metric("vllm:prefix_cache_hits_total"), srv.metric("vllm:prefix_cache_queries_total")
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
    r = client.completions.create(model="tiny", prompt=first, max_tokens=4, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens_details.cached_tokens == 0

    async def at_once():
        aclient = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        async with aclient:
            return await asyncio.gather(*(aclient.completions.create(
                model="tiny", prompt=p, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}) for p in tails))

    rs = asyncio.run(at_once())
    assert [x.usage.prompt_tokens_details.cached_tokens for x in rs] == [48, 48, 48]
    assert srv.metric("vllm:prefix_cache_hits_total") - hits == 3 * 48
    assert srv.metric("vllm:prefix_cache_queries_total") - queries == 4 * 64
