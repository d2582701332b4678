"""Our engine against transformers on the same tiny checkpoints (fp32, CPU)."""

from __future__ import annotations

import json

import pytest
import torch
from hf_checkpoints import make_checkpoint

from splitserve.engine.config import ModelConfig, rope_inv_freq
from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.sampler import SamplingParams

PROMPT = [1] + [(7 * i + 3) % 250 + 3 for i in range(24)]
DECODE_STEPS = 20
TOL = 1e-4


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]


def engine_run(path, steps=DECODE_STEPS, **kw):
    eng = LLMEngine(path, EngineConfig(device="cpu", dtype="float32", **kw))
    params = SamplingParams(max_tokens=steps + 1, ignore_eos=True, return_logits=True)
    return eng.generate([PROMPT], params)[0]


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_logits_match_transformers_over_prefill_and_decode(checkpoints, kind):
    path, hf = checkpoints[kind]
    out = engine_run(path)
    ours = torch.stack(out.logits)  # row 0: prefill; rows 1..20: decode steps
    assert ours.shape == (DECODE_STEPS + 1, 259)
    ref = hf_logits(hf, PROMPT + out.token_ids[:-1])[len(PROMPT) - 1:]
    diff = (ours - ref).abs().max().item()
    assert diff < TOL, f"{kind}: max |logit diff| {diff:.2e}"


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_greedy_generation_matches_transformers(checkpoints, kind):
    path, hf = checkpoints[kind]
    ours = engine_run(path).token_ids
    with torch.no_grad():
        ref = hf.generate(torch.tensor([PROMPT]), max_new_tokens=DECODE_STEPS + 1, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[0, len(PROMPT):].tolist()
    assert ours == ref


def test_sharded_checkpoint_loads_the_same_weights(tmp_path, checkpoints):
    path, hf = checkpoints["llama"]
    sharded = tmp_path / "sharded"
    make_checkpoint(sharded, "llama", max_shard_size="60KB")  # same seed: same weights
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    a, b = engine_run(path, steps=3), engine_run(sharded, steps=3)
    assert a.token_ids == b.token_ids
    assert torch.equal(torch.stack(a.logits), torch.stack(b.logits))


def test_mistral_sliding_window_is_applied(checkpoints, tmp_path):
    """The prompt (25) + decode outgrows the window (12): dropping the window changes logits."""
    path, _ = checkpoints["mistral"]
    cfg = json.loads((path / "config.json").read_text())
    assert ModelConfig.from_dir(path).sliding_window == 12
    full = tmp_path / "nowindow"
    full.mkdir()
    for f in path.iterdir():
        (full / f.name).write_bytes(f.read_bytes())
    (full / "config.json").write_text(json.dumps({**cfg, "sliding_window": None}))
    a, b = engine_run(path, steps=2), engine_run(full, steps=2)
    assert (torch.stack(a.logits) - torch.stack(b.logits)).abs().max() > 1e-3


def test_qwen2_ties_embeddings_and_has_qkv_bias(checkpoints):
    cfg = ModelConfig.from_dir(checkpoints["qwen2"][0])
    assert cfg.tie_word_embeddings and cfg.qkv_bias and not cfg.o_bias


def test_rope_config_spellings_agree():
    """transformers 4.x (`rope_theta` + `rope_scaling` with `type`) and 5.x (`rope_parameters`)."""
    base = dict(model_type="llama", vocab_size=10, hidden_size=64, intermediate_size=32,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4)
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
    old = ModelConfig.from_hf_dict({**base, "rope_theta": 5e5, "rope_scaling": {"type": "llama3", **scaling}})
    new = ModelConfig.from_hf_dict({**base, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **scaling}})
    assert old == new and old.rope_scaling.kind == "llama3"
    assert torch.equal(rope_inv_freq(old), rope_inv_freq(new))
    plain = ModelConfig.from_hf_dict({**base, "rope_theta": 5e5})
    assert not torch.equal(rope_inv_freq(plain), rope_inv_freq(old))
