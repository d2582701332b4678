"""`splitserve bench` in vLLM's terms against a real `splitserve serve --model tiny` (conftest.py):
chat and completions give the same tokens for the same prompt, text prompts have the exact
token counts asked (the server's own usage says so), --max-concurrency holds, ShareGPT sizes
are the tokenizer's counts, and the server's limits are checked before anything is sent."""

from __future__ import annotations

import json

import httpx

from splitserve.bench.datasets import random_sizes, sharegpt_order
from splitserve.bench.run import BenchOptions, run_bench
from splitserve.cli import main
from splitserve.engine.tokenizer import Tokenizer


def bench(srv, **kw):
    opts = dict(url=srv.url, rps=50.0, duration=None, num_prompts=4, dataset="random", random_input_len=40,
                random_output_len=6, seed=1, api_key=srv.api_key)
    opts.update(kw)
    return run_bench(BenchOptions(**opts), return_records=True)


def test_chat_gives_the_tokens_completions_gives_for_the_same_prompt(single_server):
    srv = single_server
    s, recs = bench(srv, endpoint="chat", num_prompts=5, random_range_ratio=0.5, save_outputs=True, seed=2)
    assert s["completed"] == 5 and s["bench"]["endpoint"] == "/v1/chat/completions"
    assert s["bench"]["prompt_format"] == "text"
    # the chat prompts have the sizes of --dataset random exactly: the whole chat, template included
    sizes = random_sizes(5, 40, 6, 0.5, seed=2)
    assert [(r.prompt_tokens, r.max_tokens) for r in recs] == sizes
    assert [r.usage_prompt_tokens for r in recs] == [p for p, _ in sizes]
    assert s["bench"]["prompt_tokens_off"] == 0 and s["total_input_tokens"] == sum(p for p, _ in sizes)
    for r in recs:
        assert len(r.output_ids) == r.tokens == r.max_tokens
        ids = httpx.post(srv.url + "/tokenize", json={"messages": [{"role": "user", "content": r.prompt}]}).json()
        assert ids["count"] == r.prompt_tokens
        body = {"model": "tiny", "prompt": ids["tokens"], "max_tokens": r.max_tokens, "temperature": 0,
                "ignore_eos": True}
        out = httpx.post(srv.url + "/v1/completions", json=body, timeout=30).json()
        assert out["choices"][0]["token_ids"] == r.output_ids               # token for token
        assert out["choices"][0]["text"] == r.output_text


def test_text_prompts_on_completions_have_the_planned_length(single_server):
    s, recs = bench(single_server, prompt_format="text", num_prompts=6, random_input_len=100,
                    random_range_ratio=0.9, save_outputs=True, seed=5)
    sizes = random_sizes(6, 100, 6, 0.9, seed=5)
    tok = Tokenizer.tiny()
    assert [r.prompt_tokens for r in recs] == [p for p, _ in sizes]
    assert [r.usage_prompt_tokens for r in recs] == [p for p, _ in sizes]  # the server prefilled exactly these
    # byte-level tiny: BOS + one token per character of the ASCII text
    assert [len(tok.encode(r.prompt)) for r in recs] == [p for p, _ in sizes]
    assert all(isinstance(r.prompt, str) and r.prompt.replace(" ", "").isalpha() for r in recs)
    assert s["bench"]["tokenize_calls"] > 0 and s["bench"]["prompt_tokens_off"] == 0


def overlap(recs) -> int:
    """The most [sent, end] intervals open at once."""
    events = sorted([(r.sent, 1) for r in recs] + [(r.end, -1) for r in recs], key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


def test_max_concurrency_is_never_exceeded(single_server):
    # 12 requests within about 12 ms, each streaming 32 tokens: without a limit they overlap
    s, recs = bench(single_server, rps=1000.0, num_prompts=12, random_input_len=16, random_output_len=32,
                    max_concurrency=3)
    assert s["completed"] == 12 and s["bench"]["max_concurrency"] == 3
    assert s["bench"]["peak_in_flight"] == 3                 # reached, never passed
    assert overlap(recs) <= 3
    free, free_recs = bench(single_server, rps=1000.0, num_prompts=12, random_input_len=16, random_output_len=32)
    assert free["bench"]["peak_in_flight"] > 3 and overlap(free_recs) > 3


def test_sharegpt_sizes_are_the_tokenizers_counts(single_server, tmp_path):
    convs = [("What is the capital of France?", "Paris is the capital of France."),
             ("Write a haiku about the sea", "waves fold into foam\nsalt wind writes on the grey sand\nthe tide keeps its time"),
             ("hi", "ok"),                                      # reply of 2 tokens: dropped (vLLM's minimum is 4)
             ("Count to five", "one two three four five")]
    data = [{"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]} for q, a in convs]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    tok = Tokenizer.tiny()
    usable = [i for i in sharegpt_order(4, 3) if i != 2]
    want = [(len(tok.encode(convs[i][0])), len(tok.encode(convs[i][1], add_special_tokens=False))) for i in usable]
    want = (want * 3)[:7]                                      # 7 requests from 3 usable: cycled in order
    for fmt in ("ids", "text"):
        s, recs = bench(single_server, dataset="sharegpt", dataset_path=str(path), num_prompts=7, prompt_format=fmt,
                        seed=3)
        assert [(r.prompt_tokens, r.max_tokens) for r in recs] == want, fmt
        assert [r.usage_prompt_tokens for r in recs] == [p for p, _ in want], fmt
        assert s["workload"]["name"] == "sharegpt:sg.json" and s["completed"] == 7
    # capped prompts: the ids are cut, the text is cut to the same count
    for fmt in ("ids", "text"):
        s, recs = bench(single_server, dataset="sharegpt", dataset_path=str(path), num_prompts=3, prompt_format=fmt,
                        seed=3, max_prompt_tokens=10)
        assert [r.usage_prompt_tokens for r in recs] == [min(p, 10) for p, _ in want[:3]], fmt


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def cli(srv, tmp_path, *extra, small=True):
    """small False: the default random lengths, 1024 + 128 tokens."""
    sizes = ["--random-input-len", "20", "--random-output-len", "4"] if small else []
    return ["bench", "--url", srv.url, "--rps", "20", "--num-prompts", "4", "--out", str(tmp_path / "b"),
            "--dataset", "random", "-q", *sizes, *extra]


def test_an_unknown_model_is_refused_before_sending(single_server, tmp_path, capsys):
    code, out, err = run(capsys, *cli(single_server, tmp_path, "--model", "llama-70b"))
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line == (f"error: the server at {single_server.url} does not serve the model 'llama-70b' (it serves: "
                    f"tiny); fix --model, or send anyway with --no-server-check")
    assert not (tmp_path / "b").exists()
    # sent anyway: every request fails, the run exits 1 naming the count and the server's reason
    code, out, err = run(capsys, *cli(single_server, tmp_path, "--model", "llama-70b", "--no-server-check"))
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith("error: 4 of 4 requests did not complete (4 failed, 0 rejected; more than "
                           "--max-failure-ratio 0.5); first: http_404: ")
    assert "model_not_found" in line and "Traceback" not in out + err
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["failed"] == 4


def test_requests_longer_than_the_context_are_refused(single_server, tmp_path, capsys):
    # the default random lengths, 1024 + 128, against tiny's 512-token context
    code, out, err = run(capsys, *cli(single_server, tmp_path, small=False))
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("error: 4 of 4 requests need more than the server's context of 512 tokens "
                           "(the longest: 1,024 prompt + 128 output tokens)")
    assert not (tmp_path / "b").exists()
    # --clip-to-context: 128 output tokens, 512 - 128 = 384 prompt tokens each
    code, out, err = run(capsys, *cli(single_server, tmp_path, "--clip-to-context", "--json", small=False))
    s = json.loads(out)
    assert code == 0 and s["completed"] == 4, err
    assert s["total_input_tokens"] == 4 * 384 and s["total_output_tokens"] == 4 * 128
    # sent anyway: the server refuses each one (HTTP 400), the run exits 1
    code, out, err = run(capsys, *cli(single_server, tmp_path, "--no-server-check", small=False))
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith("error: 4 of 4 requests did not complete") and "context_length_exceeded" in line


def test_an_api_key_server_and_goodput(split_server, tmp_path, capsys):
    # the split 1P+1T server with an API key: tokenize and models go with the key too
    code, out, err = run(capsys, *cli(split_server, tmp_path, "--api-key", split_server.api_key, "--endpoint", "chat",
                                      "--random-input-len", "60", "--goodput", "e2e:60000", "--json"))
    s = json.loads(out)
    assert code == 0, err
    assert s["completed"] == 4 and s["goodput"]["good"] == 4 and s["goodput"]["fraction"] == 1.0
    assert s["total_input_tokens"] == 4 * 60 and s["bench"]["prompt_tokens_off"] == 0
