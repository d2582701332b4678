"""lm-evaluation-harness (`lm-eval` from PyPI) against `serve` (issue 28 item 6), as its users run
it: the `local-completions` model on /v1/completions, with two tasks this test writes (a
multiple-choice task, scored by loglikelihood: echo + logprobs; and a generate_until task), on a
Splitwise 1P + 1T server of a Llama checkpoint made by transformers here. Every loglikelihood
lm-eval reports equals the same checkpoint's, run in-process by transformers, within 1e-4, and so
does its greedy flag; every generation equals the engine's greedy tokens."""

from __future__ import annotations

import importlib.util
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")

from splitserve.engine.hf_export import export_tokenizer  # noqa: E402

_spec = importlib.util.spec_from_file_location("hf_checkpoints", Path(__file__).parents[1] / "engine" / "hf_checkpoints.py")
hf_checkpoints = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hf_checkpoints)

DOCS = [{"question": "ab", "choices": ["cd", "xyz", "q"], "answer": 0},
        {"question": "hello w", "choices": ["orld", "ater", "ind"], "answer": 1},
        {"question": "1 2 3", "choices": [" 4", " 5 6", "!"], "answer": 2},
        {"question": "The sky is", "choices": [" blue", " green"], "answer": 0}]
MC_TASK = """task: splitserve_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
target_delimiter: ""
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""
GEN_TASK = """task: splitserve_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{choices[0]}}}}"
generation_kwargs:
  until: ["<|eos|>"]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
"""
TOL = 1e-4


def greedy_doc(hf) -> dict:
    """A question whose first choice is the model's greedy next token (a printable byte), so that
    lm-eval's greedy flag is True once."""
    for q in ("ab", "cd", "ef", "gh", "ij", "kl", "mn", "op", "qr", "st", "uv", "wx", "yz", "Hi", "Yo", "Ok"):
        ids = [3 + b for b in q.encode()]  # the tiny tokenizer: byte b is id 3 + b, no BOS here
        with torch.no_grad():
            nxt = int(hf(torch.tensor([ids])).logits[0, -1].argmax()) - 3
        if 32 <= nxt < 127:
            return {"question": q, "choices": [chr(nxt), "~~"], "answer": 0}
    raise AssertionError("no printable greedy token")


def test_lm_eval_loglikelihoods_equal_transformers(server_factory, tmp_path):
    ckpt = tmp_path / "llama"
    hf = hf_checkpoints.make_checkpoint(ckpt, "llama")
    tok_dir = export_tokenizer("tiny", tmp_path / "tokenizer")
    docs = DOCS + [greedy_doc(hf)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "mc.yaml").write_text(MC_TASK.format(data=tmp_path / "data.jsonl"))
    (tasks / "gen.yaml").write_text(GEN_TASK.format(data=tmp_path / "data.jsonl"))
    from lm_eval.tasks import TaskManager
    with ThreadPoolExecutor(1) as pool:  # lm-eval indexes its task registry (~6 s of one core) while the
        manager = pool.submit(TaskManager, include_path=str(tasks))  # server's processes start
        srv = server_factory("--model", str(ckpt), "--prompt-workers", "1", "--token-workers", "1")
        task_manager = manager.result()
    name = httpx.get(srv.url + "/v1/models", timeout=10).json()["data"][0]["id"]

    out = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=f"base_url={srv.url}/v1/completions,model={name},tokenizer_backend=huggingface,"
                   f"tokenizer={tok_dir},max_retries=1,max_length=200",
        tasks=["splitserve_mc", "splitserve_gen"], task_manager=task_manager,
        log_samples=True, random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)

    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    mc = out["samples"]["splitserve_mc"]
    assert len(mc) == len(docs)
    checked, greedy_seen = 0, 0
    for s in mc:
        for (ctx, cont), [(ll, greedy)] in zip((r for r in s["arguments"]), s["resps"]):
            whole = tok(ctx + cont, add_special_tokens=False)["input_ids"]
            n_ctx = len(tok(ctx, add_special_tokens=False)["input_ids"])
            with torch.no_grad():
                lp = torch.log_softmax(hf(torch.tensor([whole])).logits[0].float(), -1)
            want = lp[torch.arange(n_ctx - 1, len(whole) - 1), torch.tensor(whole[n_ctx:])]
            assert abs(ll - want.sum().item()) < TOL, (ctx, cont, ll, want.sum().item())
            assert greedy == bool((lp[n_ctx - 1:len(whole) - 1].argmax(-1) == torch.tensor(whole[n_ctx:])).all())
            checked += 1
            greedy_seen += greedy
    assert checked == sum(len(d["choices"]) for d in docs) and greedy_seen >= 1
    assert out["results"]["splitserve_mc"]["acc,none"] is not None

    from splitserve.engine.engine import EngineConfig, LLMEngine
    from splitserve.engine.sampler import SamplingParams
    eng = LLMEngine(str(ckpt), EngineConfig(device="cpu", dtype="float32"))
    gen = out["samples"]["splitserve_gen"]
    assert len(gen) == len(docs)
    for s in gen:
        (ctx, kwargs), = s["arguments"]
        ids = tok(ctx, add_special_tokens=False)["input_ids"]
        ref = eng.generate([ids], [SamplingParams(max_tokens=6)])[0]
        assert s["resps"][0][0] == tok.decode(ref.token_ids, skip_special_tokens=True).split("<|eos|>")[0]
