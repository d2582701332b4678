"""vLLM's sampling extensions through `serve` with the official `openai` client (`extra_body`), on
a Splitwise 1P + 1T server (the first token sampled on the prompt worker, the rest on the token
worker) and an unsplit one, streaming and not (issue 45 item 5): `guided_choice`, `guided_regex`,
`guided_json` and `guided_grammar` follow their grammar; `min_tokens` holds off a stop token;
`min_p` 1 samples only the most likely token (so it answers as greedy does); and the front end's
`include_stop_str_in_output` and `skip_special_tokens`. Each answer is checked against the
engine's own greedy tokens or against its grammar, not only for its status."""

from __future__ import annotations

import json
import re

import openai
import pytest

from .conftest import reference

pytest.importorskip("llguidance")

PROMPT = [1] + [(13 * i + 7) % 250 + 3 for i in range(12)]   # tiny: byte b is token 3 + b; EOS is 2
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["n", "ok"],
          "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}}}


@pytest.fixture(params=["split_server", "single_server"])
def server(request):
    return request.getfixturevalue(request.param)


def complete(srv, stream: bool, **kw) -> tuple[str, list[int], str]:
    """(text, token ids, finish reason) of one completion, streamed or not."""
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.api_key or "none", max_retries=0)
    kw = dict(model="tiny", prompt=PROMPT, **kw)
    if stream:
        chunks = [c for c in client.completions.create(stream=True, **kw) if c.choices]
        return ("".join(c.choices[0].text for c in chunks),
                [t for c in chunks for t in c.choices[0].model_extra["token_ids"]], chunks[-1].choices[0].finish_reason)
    r = client.completions.create(**kw)
    return r.choices[0].text, r.choices[0].model_extra["token_ids"], r.choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True])
def test_guided_fields_follow_their_grammar(server, stream):
    choices = ["red", "green", "blue violet"]
    for seed in range(3):
        sampled = dict(max_tokens=40, temperature=1.0, seed=seed, stream=stream)
        text, _, why = complete(server, extra_body={"guided_choice": choices}, **sampled)
        assert text in choices and why == "stop", (text, why)
        text, _, why = complete(server, extra_body={"guided_regex": r"[0-9]{3}-[a-z]{2}"}, **sampled)
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", text) and why == "stop", (text, why)
        text, _, why = complete(server, extra_body={"guided_json": SCHEMA}, **sampled)
        got = json.loads(text)
        assert set(got) == {"n", "ok"} and 0 <= got["n"] <= 99 and isinstance(got["ok"], bool), text
        text, _, why = complete(server, extra_body={"guided_grammar": 'start: "x" ("y" | "z")+ "!"'}, **sampled)
        assert re.fullmatch(r"x[yz]+!", text) and why == "stop", (text, why)


@pytest.mark.parametrize("stream", [False, True])
def test_min_tokens_holds_off_a_stop_token_and_min_p_one_is_greedy(server, reference_engine, stream):
    greedy = reference(reference_engine, [PROMPT], [12], ignore_eos=True)[0]
    stop = greedy[0]                                  # the first token it would make
    _, ids, why = complete(server, stream, max_tokens=12, temperature=0.0, extra_body={"stop_token_ids": [stop]})
    assert ids == [stop] and why == "stop"
    _, ids, why = complete(server, stream, max_tokens=12, temperature=0.0,
                           extra_body={"stop_token_ids": [stop], "min_tokens": 5})
    assert len(ids) >= 5 and stop not in ids[:5], ids     # masked for the first five: never sampled there
    assert why == ("stop" if stop in ids else "length")
    _, ids, _ = complete(server, stream, max_tokens=12, temperature=1.0, seed=4,
                         extra_body={"min_p": 1.0, "ignore_eos": True})
    assert ids == greedy


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_kept_and_special_tokens_shown_on_request(server, reference_engine, stream):
    greedy = reference(reference_engine, [PROMPT], [12], ignore_eos=True)[0]
    full, _, _ = complete(server, stream, max_tokens=12, temperature=0.0, extra_body={"ignore_eos": True})
    stop = full[4:6]
    assert stop and stop not in full[:5], full        # a stop string that first shows at character 4
    cut, _, why = complete(server, stream, max_tokens=12, temperature=0.0, stop=[stop], extra_body={"ignore_eos": True})
    kept, _, _ = complete(server, stream, max_tokens=12, temperature=0.0, stop=[stop],
                          extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    assert (cut, kept, why) == (full[:4], full[:6], "stop")
    eos = dict(max_tokens=3, temperature=0.0, extra_body={"ignore_eos": True, "logit_bias": {"2": 100}})
    hidden, ids, _ = complete(server, stream, **eos)
    shown, _, _ = complete(server, stream, **{**eos, "extra_body": {**eos["extra_body"], "skip_special_tokens": False}})
    assert ids == [2, 2, 2] and hidden == "" and shown and len(greedy) == 12, (hidden, shown)
