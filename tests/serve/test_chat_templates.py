"""Chat templates rendered as transformers renders them (issue 45 item 3): three templates written
for these tests in the styles of Llama 3.1 (strftime_now, tojson with indent, loop controls),
Qwen2.5 (tools in the system turn, Hermes tool calls, message names) and Mistral (raise_exception
on roles that do not alternate) give the same prompt text from `render_chat` as from transformers'
`apply_chat_template`, tools and earlier tool calls included; a template's raise_exception is a
400; `serve --chat-template FILE` uses the file, and a model directory's `chat_template.jinja` is
read where tokenizer_config.json has none."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import httpx
import pytest

from splitserve.engine.tokenizer import Tokenizer
from splitserve.serve.openai_io import ApiError, ModelInfo, render_chat
from splitserve.serve.prompts import chat_messages

from .conftest import API_KEY

transformers = pytest.importorskip("transformers")

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the forecast",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'}}
CONVERSATIONS = {
    "plain": [{"role": "system", "content": "Be brief. "}, {"role": "user", "content": "Hi there"},
              {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Où est la gare ?", "name": "ana"}],
    "tools": [{"role": "user", "content": "Weather in Lima?"}, {"role": "assistant", "content": None,
                                                                 "tool_calls": [CALL]},
              {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
}


def hf_render(template: str, messages: list[dict], tools, add_generation_prompt: bool) -> str:
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.tiny().tk, bos_token="<s>",
                                               eos_token="</s>")
    tok.chat_template = template
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)


@pytest.mark.parametrize("style", ["llama3_style", "qwen2_style"])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("generation", [True, False])
def test_a_template_renders_as_transformers_renders_it(style, conversation, generation):
    template = (TEMPLATES / f"{style}.jinja").read_text()
    info = dataclasses.replace(ModelInfo.load("tiny"), chat_template=template, bos_token="<s>", eos_token="</s>")
    messages = chat_messages(CONVERSATIONS[conversation])
    tools = TOOLS if conversation == "tools" else None
    ours = render_chat(messages, info, generation, tools)
    assert ours == hf_render(template, messages, tools, generation)
    assert ("get_weather" in ours) == (tools is not None)


def test_a_template_that_raises_is_a_400_naming_its_message():
    template = (TEMPLATES / "mistral_style.jinja").read_text()
    info = dataclasses.replace(ModelInfo.load("tiny"), chat_template=template, bos_token="<s>", eos_token="</s>")
    ok = chat_messages([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                        {"role": "user", "content": "c"}])
    assert render_chat(ok, info) == hf_render(template, ok, None, True) == "<s>[INST] a [/INST]b</s>[INST] c [/INST]"
    with pytest.raises(ApiError) as e:
        render_chat(chat_messages([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]), info)
    assert e.value.status == 400 and "must alternate" in e.value.message


def test_a_model_directory_s_chat_template_jinja_is_read(tmp_path):
    from splitserve.engine.hf_export import export_tokenizer

    export_tokenizer("tiny", tmp_path)      # config.json and the tokenizer's files: what ModelInfo reads
    tc = json.loads((tmp_path / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tc))
    (tmp_path / "chat_template.jinja").write_text((TEMPLATES / "mistral_style.jinja").read_text())
    assert ModelInfo.load(str(tmp_path)).chat_template.startswith("{#- written for splitserve's tests")


def test_serve_uses_the_chat_template_file(server_factory):
    srv = server_factory("--design", "baseline", "--mixed-workers", "1", "--chat-template",
                         str(TEMPLATES / "qwen2_style.jinja"), api_key=API_KEY)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    msgs = [{"role": "user", "content": "Hi"}]
    r = httpx.post(srv.url + "/tokenize", json={"messages": msgs}, headers=headers, timeout=30).json()
    text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert r["tokens"] == Tokenizer.tiny().encode(text, add_special_tokens=False)
    bad = httpx.post(srv.url + "/v1/chat/completions", headers=headers, timeout=30,
                     json={"messages": [{"role": "user", "content": "Hi", "name": 5}], "max_tokens": 1})
    assert bad.status_code == 400
