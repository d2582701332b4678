"""Log-probabilities through `serve` with the official `openai` client (issue 28 item 5), streaming
and not, on a Splitwise 1P + 1T server (KV layer by layer), a 2P + 2T one (KV serialized) and an
unsplit one: completions' `logprobs` with `echo` (the prompt's too), chat's `logprobs` /
`top_logprobs` and vLLM's `prompt_logprobs` equal the engine's own records (engine/logprobs.py,
checked against transformers in tests/engine/test_logprobs.py) within 1e-4, the top N the same
tokens. In split serving the first token's records come with it whichever way it reaches the
router first (the prompt worker's `out` or the token worker's `kv_in`): 16 requests at once."""

from __future__ import annotations

import codecs

from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import openai
import pytest

from splitserve.engine.sampler import SamplingParams

TOL = 1e-4
PROMPTS = [[1] + [(7 * i + 13 * k) % 250 + 3 for i in range(10 + 3 * k)] for k in range(16)]


@pytest.fixture(params=["split_server", "split_2x2_server", "single_server"])
def server(request):
    return request.getfixturevalue(request.param)


def client_of(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.api_key or "none", max_retries=0)


def engine_records(engine, prompt: list[int], n: int, max_tokens: int):
    out = engine.generate([prompt], [SamplingParams(max_tokens=max_tokens, ignore_eos=True, logprobs=n,
                                                    prompt_logprobs=n)])[0]
    return out.token_ids, out.prompt_logprobs, out.logprobs


def text(tok: int) -> str:  # the tiny tokenizer: ids 0-2 special, byte b is 3 + b
    from splitserve.engine.tokenizer import Tokenizer
    return Tokenizer.tiny().decode([tok], skip_special_tokens=False)


def check_completion(lp, prompt, ids, prompt_recs, recs, n):
    """A completions `logprobs` object (echo: prompt first) against the engine's records."""
    rows = [None] + prompt_recs + recs
    assert lp.tokens == [text(t) for t in prompt + ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for got, top, want in zip(lp.token_logprobs[1:], lp.top_logprobs[1:], rows[1:]):
        assert abs(got - want[1]) < TOL
        wanted = {text(want[0]): want[1], **{text(t): v for t, v in want[3][:n] if text(t) not in top}}
        assert set(top) == {text(want[0])} | {text(t) for t, _ in want[3][:n]}
        assert max(abs(top[k] - v) for k, v in wanted.items() if k in top) < TOL
    assert lp.text_offset == offsets(prompt + ids)


def offsets(ids: list[int]) -> list[int]:
    """Where each tiny token starts in the text: the BOS adds nothing, a character's bytes count once
    it is whole (byte b is token 3 + b)."""
    dec, at, out = codecs.getincrementaldecoder("utf-8")("replace"), 0, []
    for t in ids:
        out.append(at)
        at += len(dec.decode(bytes([t - 3]) if t >= 3 else b""))
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_completions_logprobs_with_echo(server, reference_engine, stream):
    client = client_of(server)

    def one(prompt):
        kw = dict(model="tiny", prompt=prompt, max_tokens=5, temperature=0, logprobs=2, echo=True,
                  extra_body={"ignore_eos": True})
        if not stream:
            return client.completions.create(**kw).choices[0].logprobs
        merged = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for ch in client.completions.create(stream=True, **kw):
            if ch.choices and ch.choices[0].logprobs is not None:
                for k in merged:
                    merged[k] += getattr(ch.choices[0].logprobs, k)
        return SimpleNamespace(**merged)

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, PROMPTS))
    for prompt, lp in zip(PROMPTS, got):
        ids, prompt_recs, recs = engine_records(reference_engine, prompt, 2, 5)
        check_completion(lp, prompt, ids, prompt_recs, recs, 2)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs(server, reference_engine, stream):
    client = client_of(server)
    messages = [{"role": "user", "content": "Say something."}]
    ids = httpx.post(server.url + "/tokenize", json={"model": "tiny", "messages": messages},
                     headers=server.headers, timeout=10).json()["tokens"]
    kw = dict(model="tiny", messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3,
              extra_body={"ignore_eos": True})
    if stream:
        content = [c for ch in client.chat.completions.create(stream=True, **kw)
                   if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    else:
        content = client.chat.completions.create(**kw).choices[0].logprobs.content
    toks, _, recs = engine_records(reference_engine, ids, 3, 6)
    assert [c.token for c in content] == [text(t) for t in toks]
    for c, (tok, lp, rank, top) in zip(content, recs):
        assert abs(c.logprob - lp) < TOL and c.bytes == ([tok - 3] if tok >= 3 else [])  # the token's own byte
        assert [t.token for t in c.top_logprobs] == [text(t) for t, _ in top]
        assert max(abs(t.logprob - v) for t, (_, v) in zip(c.top_logprobs, top)) < TOL


def test_vllm_prompt_logprobs_and_refusals(split_server, reference_engine):
    client = client_of(split_server)
    prompt = PROMPTS[3]
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0,
                                  extra_body={"prompt_logprobs": 1, "ignore_eos": True})
    got = r.choices[0].model_extra["prompt_logprobs"]
    _, prompt_recs, _ = engine_records(reference_engine, prompt, 1, 2)
    assert got[0] is None and len(got) == len(prompt)
    for d, (tok, lp, rank, top) in zip(got[1:], prompt_recs):
        assert abs(d[str(tok)]["logprob"] - lp) < TOL and d[str(tok)]["rank"] == rank
        assert str(top[0][0]) in d and d[str(top[0][0])]["rank"] == 1
    assert r.choices[0].logprobs is None
    for kw, param in ((dict(logprobs=21), "logprobs"),):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="tiny", prompt=prompt, max_tokens=2, **kw)
        assert e.value.body["param"] == param
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       top_logprobs=2)
    assert e.value.body["param"] == "top_logprobs"
