"""A benchmark client nobody on this project wrote, from PyPI, against a real `serve --model tiny`
(issue 17 item 3): guidellm's own command line (`python -m guidellm run`), offline, with the tokenizer
directory that `serve --tokenizer-dir` wrote as its tokenizer. Its JSON report must say what we served:
every request succeeded, each prompt's token count is the server's (/tokenize) and the one guidellm
aimed at with our tokenizer, each output is 8 tokens, and the streamed text is the reference engine's
greedy output, decoded."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import httpx
import pytest

from splitserve.engine.tokenizer import Tokenizer

from .conftest import reference, start_server, stop_server

pytestmark = pytest.mark.skipif(importlib.util.find_spec("guidellm") is None,
                                reason="guidellm is not installed (it is in the test extra: "
                                       "pip install torch==2.13.0 '.[test]')")

REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS = 6, 32, 8
# the chat template's tokens around one user message (BOS, <|user|>\n, \n, <|assistant|>\n)
CHAT_OVERHEAD = 1 + len("<|user|>\n") + 1 + len("<|assistant|>\n")


def run_guidellm(url: str, tokenizer_dir, out, endpoint: str) -> dict:
    backend = {"kind": "openai_http", "target": url, "model": "tiny", "request_format": endpoint,
               "extras": {"body": {"temperature": 0}}}     # greedy: the outputs can be checked
    cmd = [sys.executable, "-m", "guidellm", "run",
           "--backend", json.dumps(backend),
           "--tokenizer", f"kind=hf_auto,model={tokenizer_dir}",
           "--profile", "kind=concurrent,streams=3",
           "--constraint", f"kind=max_requests,count={REQUESTS}",
           "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
           "--output", f"kind=json,path={out}",
           "--disable-console"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    p = subprocess.run(cmd, env=env, cwd=out.parent, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server that wrote its tokenizer for clients to --tokenizer-dir, and that directory."""
    tok_dir = tmp_path_factory.mktemp("client") / "tokenizer"
    srv = start_server("--tokenizer-dir", str(tok_dir))
    yield srv, tok_dir
    stop_server(srv)


def test_serve_wrote_the_tokenizer_dir(served):
    _, tok_dir = served
    assert sorted(p.name for p in tok_dir.iterdir()) == [
        "config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]


# One endpoint, guidellm's default (chat: content parts, max_completion_tokens, the template): a run
# took 15-28 s on 2 shared cores, most of it guidellm's own start (torch, transformers, datasets).
# "/v1/completions" passed the same checks when it was a parameter here (6 of 6, 32 prompt tokens each).
@pytest.mark.parametrize("endpoint", ["/v1/chat/completions"])
def test_guidellm_measures_what_we_served(served, reference_engine, tmp_path, endpoint):
    srv, tok_dir = served
    report = run_guidellm(srv.url, tok_dir, tmp_path / "report.json", endpoint)

    (bench,) = report["benchmarks"]
    assert bench["scheduler_metrics"]["requests_made"] == {"successful": REQUESTS, "errored": 0,
                                                           "incomplete": 0, "total": REQUESTS}
    done = bench["requests"]["successful"]
    assert len(done) == REQUESTS and bench["requests"]["errored"] == [] and bench["requests"]["incomplete"] == []
    ours = Tokenizer.tiny()
    for r in done:
        body = json.loads(r["request_args"])["body"]
        assert (body["model"], body["stream"], body["ignore_eos"]) == ("tiny", True, True)
        if endpoint == "/v1/completions":
            text = body["prompt"]
            probe = {"model": "tiny", "prompt": text}
        else:
            (msg,) = body["messages"]
            text = "".join(part["text"] for part in msg["content"])
            probe = {"model": "tiny", "messages": [{"role": "user", "content": text}]}
        # guidellm sized the prompt with the exported tokenizer: BOS + 31 bytes
        assert len(ours.encode(text)) == PROMPT_TOKENS
        served = httpx.post(srv.url + "/tokenize", json=probe, timeout=10).json()
        # a chat message's text has no BOS of its own: the template's is one of CHAT_OVERHEAD
        expected_prompt = PROMPT_TOKENS if endpoint == "/v1/completions" else PROMPT_TOKENS - 1 + CHAT_OVERHEAD
        assert r["prompt_tokens"] == served["count"] == expected_prompt
        assert r["output_tokens"] == OUTPUT_TOKENS
        assert r["time_to_first_token_ms"] > 0 and r["request_latency"] * 1000 >= r["time_to_first_token_ms"]
        (ref,) = reference(reference_engine, [served["tokens"]], [OUTPUT_TOKENS], ignore_eos=True)
        assert r["output"] == ours.decode(ref)
    totals = bench["metrics"]["output_token_count"]["successful"]
    assert totals["total_sum"] == REQUESTS * OUTPUT_TOKENS
