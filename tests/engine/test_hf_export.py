"""The built-in tokenizer as a Hugging Face tokenizer directory (engine/hf_export.py, issue 17 item 3):
transformers' AutoTokenizer loads it and encodes, decodes and renders chat prompts token for token as
splitserve does."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitserve.cli import main
from splitserve.engine.config import ModelConfig
from splitserve.engine.hf_export import (client_tokenizer_dir, client_tokenizer_note, default_cache_dir,
                                         export_tokenizer)
from splitserve.engine.presets import get_preset
from splitserve.engine.tokenizer import Tokenizer
from splitserve.errors import UserError

transformers = pytest.importorskip("transformers")

SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>"]
# text with the special tokens' spellings mixed in (they are matched in text, by both)
TEXT = st.lists(st.one_of(st.text(max_size=20), st.sampled_from(SPECIALS + ["<|user|>", "<|", "|>"])),
                max_size=8).map("".join)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    return export_tokenizer("tiny", tmp_path_factory.mktemp("tok") / "tiny")


@pytest.fixture(scope="module")
def hf(exported):
    return transformers.AutoTokenizer.from_pretrained(str(exported))


def test_the_directory_holds_the_four_files_and_the_config_says_the_preset(exported):
    assert sorted(p.name for p in exported.iterdir()) == [
        "config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    cfg = json.loads((exported / "tokenizer_config.json").read_text())
    assert (cfg["bos_token"], cfg["eos_token"], cfg["pad_token"]) == ("<|bos|>", "<|eos|>", "<|pad|>")
    assert cfg["model_max_length"] == 512
    # config.json reads back to the preset's shape (RoPE unscaled: its unused original length differs;
    # init_std is the random initialisation's, no config.json field)
    back, tiny = ModelConfig.from_dir(exported), get_preset("tiny")
    assert back.rope_scaling.kind == tiny.rope_scaling.kind == "default"
    assert replace(back, rope_scaling=tiny.rope_scaling, init_std=tiny.init_std) == tiny


def test_auto_tokenizer_has_the_vocabulary_and_special_ids(hf):
    assert len(hf) == 259
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) == (0, 1, 2)
    assert hf.model_max_length == 512
    assert hf("hi")["input_ids"] == [1, 3 + ord("h"), 3 + ord("i")]          # BOS, then byte + 3
    assert hf.decode([1, 3 + 0xC3, 3 + 0xA9, 2]) == "<|bos|>é<|eos|>"       # UTF-8 of é, specials kept
    # no clean-up of spaces before punctuation (transformers 4 would do it by default)
    assert hf.decode(hf("a . b , c 's do n't ?")["input_ids"], skip_special_tokens=True) == "a . b , c 's do n't ?"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT, special=st.booleans())
def test_encode_is_token_for_token_splitserves(hf, text, special):
    ours = Tokenizer.tiny()
    assert hf(text, add_special_tokens=special)["input_ids"] == ours.encode(text, add_special_tokens=special)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(0, 258), max_size=40), skip=st.booleans())
def test_decode_is_splitserves_on_any_ids(hf, ids, skip):
    # any ids: specials anywhere, byte sequences that are not UTF-8 (both write U+FFFD)
    ours = Tokenizer.tiny()
    assert hf.decode(ids, skip_special_tokens=skip) == ours.decode(ids, skip_special_tokens=skip)


MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                 "content": st.text(max_size=30)})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(MESSAGE, min_size=1, max_size=4), gen=st.booleans())
def test_chat_template_gives_the_ids_the_server_runs(hf, messages, gen):
    from splitserve.serve.openai_io import ModelInfo
    from splitserve.serve.schema import tokenize

    body = {"model": "tiny", "messages": messages, "add_generation_prompt": gen}
    served = tokenize(json.dumps(body).encode(), ModelInfo.load("tiny"))["tokens"]   # vLLM's POST /tokenize
    assert hf.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True)["input_ids"] == served


def test_chat_template_by_hand(hf):
    ids = hf.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                 tokenize=True)["input_ids"]
    text = "<|user|>\nhi\n<|assistant|>\n"
    assert ids == [1] + [3 + b for b in text.encode()]      # 1 + 26 ids
    assert len(ids) == 27


def test_a_reduced_tiny_keeps_its_context_and_layers(tmp_path):
    d = export_tokenizer("tiny-1l", tmp_path / "t1")
    assert json.loads((d / "tokenizer_config.json").read_text())["model_max_length"] == 512
    assert json.loads((d / "config.json").read_text())["num_hidden_layers"] == 1


def test_the_command_writes_it(tmp_path, capsys):
    assert main(["tokenizer", "export", str(tmp_path / "out"), "--model", "tiny"]) == 0
    assert capsys.readouterr().out == f"wrote the tiny tokenizer to {tmp_path / 'out'}\n"
    assert (tmp_path / "out" / "tokenizer.json").read_text() == Tokenizer.tiny().tk.to_str(pretty=True)


@pytest.mark.parametrize("args, message", [
    (["--model", "small"], "error: preset 'small' has no built-in tokenizer (its vocabulary is a size only); "
                           "only tiny (and tiny-<N>l) has one\n"),
    (["--model", "nope"], "error: unknown model 'nope': not a directory and not a preset"),
])
def test_the_command_refuses_presets_without_a_tokenizer(tmp_path, capsys, args, message):
    assert main(["tokenizer", "export", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_the_command_refuses_a_path_it_cannot_write(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["tokenizer", "export", str(tmp_path / "file" / "out")]) == 2
    assert capsys.readouterr().err == f"error: cannot write the tokenizer to {tmp_path / 'file' / 'out'}: Not a directory\n"


def test_serve_writes_it_under_the_cache_or_the_given_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_cache_dir() == tmp_path / "cache" / "splitserve" / "tokenizers"
    assert client_tokenizer_dir("tiny", None) == tmp_path / "cache" / "splitserve" / "tokenizers" / "tiny"
    assert client_tokenizer_dir("tiny", tmp_path / "mine") == tmp_path / "mine"
    monkeypatch.chdir(tmp_path)
    assert client_tokenizer_dir("tiny", Path("rel")) == tmp_path / "rel"       # printed absolute
    assert (tmp_path / "mine" / "tokenizer.json").is_file()
    assert client_tokenizer_dir("small", None) is None          # nothing to write: no line either
    assert client_tokenizer_note("small", None) is None
    assert client_tokenizer_note("tiny", tmp_path / "mine") == (
        f"the tiny tokenizer for clients (Hugging Face format): {tmp_path / 'mine'}")


def test_an_unwritable_cache_is_a_warning_and_an_unwritable_dir_an_error(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    note = client_tokenizer_note("tiny", None)
    assert note.startswith("warning: no tokenizer directory for clients (cannot write the tokenizer to ")
    with pytest.raises(UserError, match="cannot write the tokenizer to"):
        client_tokenizer_note("tiny", tmp_path / "file" / "x")
