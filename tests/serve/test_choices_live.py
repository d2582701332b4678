"""`n` > 1 and `best_of` through `serve` with the official `openai` client (issue 28 item 5), on a
Splitwise 1P + 1T server and an unsplit one, streaming and not: choice i is the engine's own
sampling of the prompt with seed + i (a seeded request's tokens depend only on its seed); with
`best_of` the answer is the child of highest cumulative logprob, and usage counts every child's
tokens; with prefix caching on, the children after the first take the prompt's blocks from the
prompt worker's cache (off: none do).
Refusals: best_of < n, a streamed best_of > n, n past 16."""

from __future__ import annotations

import openai
import pytest

from splitserve.engine.sampler import SamplingParams

PROMPT = [1] + [(11 * i + 7) % 250 + 3 for i in range(40)]
KW = dict(model="tiny", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=7, extra_body={"ignore_eos": True})


@pytest.fixture(params=["split_server", "single_server"])
def server(request):
    return request.getfixturevalue(request.param)


def client_of(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.api_key or "none", max_retries=0)


def sampled(engine, seed: int, logprobs: int | None = None):
    return engine.generate([PROMPT], [SamplingParams(max_tokens=6, temperature=1.0, seed=seed, ignore_eos=True,
                                                     logprobs=logprobs)])[0]


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_are_the_seeds_in_turn(server, reference_engine, stream):
    client = client_of(server)
    want = [sampled(reference_engine, 7 + i).token_ids for i in range(3)]
    assert len({tuple(w) for w in want}) == 3  # sampling: three different answers
    if stream:
        got: dict[int, list[int]] = {}
        reasons = {}
        for ch in client.completions.create(n=3, stream=True, **KW):
            for c in ch.choices:
                got.setdefault(c.index, []).extend(c.model_extra["token_ids"])
                if c.finish_reason:
                    reasons[c.index] = c.finish_reason
        assert [got[i] for i in range(3)] == want and reasons == {0: "length", 1: "length", 2: "length"}
    else:
        r = client.completions.create(n=3, **KW)
        assert [c.index for c in r.choices] == [0, 1, 2]
        assert [c.model_extra["token_ids"] for c in r.choices] == want
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(PROMPT), 18)


def test_chat_n(server):
    client = client_of(server)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], n=2, max_tokens=4,
                                       temperature=1.0, seed=3, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1] and r.usage.completion_tokens == 8
    one = [client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                          temperature=1.0, seed=s, extra_body={"ignore_eos": True})
           for s in (3, 4)]
    assert [c.message.content for c in r.choices] == [o.choices[0].message.content for o in one]


def test_best_of_answers_the_most_likely_children(server, reference_engine):
    client = client_of(server)
    children = [sampled(reference_engine, 7 + i, logprobs=0) for i in range(4)]
    score = [sum(rec[1] for rec in c.logprobs) for c in children]
    order = sorted(range(4), key=lambda i: -score[i])
    r = client.completions.create(n=2, best_of=4, **KW)
    assert [c.model_extra["token_ids"] for c in r.choices] == [children[i].token_ids for i in order[:2]]
    assert r.usage.completion_tokens == 24 and all(c.logprobs is None for c in r.choices)
    r = client.completions.create(n=1, best_of=4, logprobs=1, **KW)
    assert r.choices[0].model_extra["token_ids"] == children[order[0]].token_ids
    assert abs(sum(r.choices[0].logprobs.token_logprobs) - score[order[0]]) < 1e-4


@pytest.mark.parametrize("caching", [True, False])
def test_children_share_the_prompt_through_the_prefix_cache(server_factory, split_server, caching):
    """The first child computes the prompt; the three others follow its first token and take its
    2 full blocks (32 of the 41 tokens) from the prompt worker's cache (the session's 1P + 1T
    server); with --no-prefix-caching nothing is looked up."""
    srv = split_server if caching else server_factory("--prompt-workers", "1", "--token-workers", "1",
                                                      "--no-prefix-caching")
    names = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
    before = [srv.metric(n) for n in names]
    prompt = [1] + [(5 * i + 99) % 250 + 3 for i in range(40)]  # not sent before in this session
    r = client_of(srv).completions.create(n=4, **{**KW, "prompt": prompt})
    assert len(r.choices) == 4
    got = [srv.metric(n) - b for n, b in zip(names, before)]
    assert got == ([4 * 41, 3 * 32] if caching else [0, 0])


def test_refusals(split_server):
    client = client_of(split_server)
    for kw, param in ((dict(n=3, best_of=2), "best_of"), (dict(n=1, best_of=2, stream=True), "best_of"),
                      (dict(n=17), "n")):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(**{**KW, **kw})
        assert e.value.body["param"] == param, e.value.body
