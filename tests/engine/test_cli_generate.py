"""`splitserve generate` (the function the CLI calls)."""

from __future__ import annotations

import json

import pytest

from splitserve.cli.generate import GenerateRequest, run_generate
from splitserve.errors import UserError


def run(capsys, **kw):
    args = dict(model="tiny", prompt=None, prompt_ids=None, max_tokens=6, temperature=0.0, seed=0,
                json_out=True, device="cpu", dtype="auto")
    args.update(kw)
    assert run_generate(GenerateRequest(**args)) == 0
    return capsys.readouterr().out


def test_json_output_with_text_prompt(capsys):
    out = json.loads(run(capsys, prompt="Hello"))
    assert set(out) == {"token_ids", "text"}
    assert len(out["token_ids"]) <= 6 and all(isinstance(t, int) for t in out["token_ids"])
    assert isinstance(out["text"], str)


def test_tiny_is_deterministic_and_seed_only_affects_sampling(capsys):
    a = run(capsys, prompt_ids="1,72,101")
    b = run(capsys, prompt_ids="1,72,101", seed=9)  # greedy: the seed does not change weights
    assert a == b
    s1 = run(capsys, prompt_ids="1,72,101", temperature=1.0, seed=1)
    s1_again = run(capsys, prompt_ids="1,72,101", temperature=1.0, seed=1)
    assert s1 == s1_again


def test_plain_output_prints_text(capsys):
    out = run(capsys, prompt="Hi", json_out=False)
    text = json.loads(run(capsys, prompt="Hi"))["text"]
    assert out == text + "\n"


def test_checkpoint_without_tokenizer_prints_ids(capsys, checkpoints, tmp_path):
    src, _ = checkpoints["llama"]
    d = tmp_path / "ck"
    d.mkdir()
    for f in src.iterdir():
        if f.name != "tokenizer.json":
            (d / f.name).write_bytes(f.read_bytes())
    out = json.loads(run(capsys, model=str(d), prompt_ids="1,2,3"))
    assert out["text"] is None and out["token_ids"]
    with pytest.raises(UserError, match="no tokenizer"):
        run(capsys, model=str(d), prompt="text")


@pytest.mark.parametrize("kw, msg", [
    (dict(prompt="a", prompt_ids="1"), "exactly one"),
    (dict(), "exactly one"),
    (dict(prompt_ids="1,x"), "comma-separated"),
    (dict(model="no-such-model", prompt="a"), "unknown model"),
    (dict(prompt_ids=",".join(["5"] * 600)), "model context is 512"),
    (dict(prompt="a", max_tokens=0), "--max-tokens must be at least 1"),
    (dict(prompt="a", dtype="int3"), "unknown dtype"),
])
def test_errors_are_one_line_user_errors(capsys, kw, msg):
    with pytest.raises(UserError, match=msg) as e:
        run(capsys, **kw)
    assert "\n" not in str(e.value)
