"""Tiny Hugging Face checkpoints built with transformers in a tmp dir (nothing is downloaded)."""

from __future__ import annotations

import torch

from splitserve.engine.tokenizer import tiny_tokenizer

VOCAB = 259  # the tiny byte-level tokenizer's size


def hf_config(kind: str, **over):
    """A tiny config of `kind`: llama (Llama 3.1 RoPE scaling), mistral (sliding window 12) or
    qwen2 (q/k/v biases, tied embeddings)."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
    common.update(over)
    if kind == "llama":
        return tf.LlamaConfig(**common, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32}, rope_theta=10000.0)
    if kind == "mistral":
        return tf.MistralConfig(**common, sliding_window=12, rope_theta=10000.0)
    if kind == "qwen2":
        return tf.Qwen2Config(**common, tie_word_embeddings=True, rope_theta=10000.0)
    raise ValueError(kind)


HF_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def make_checkpoint(path, kind: str, seed: int = 0, max_shard_size: str | None = None, **over):
    """Save a random tiny `kind` model (and the tiny tokenizer) to `path`; return the HF model."""
    import transformers as tf

    torch.manual_seed(seed)
    model = getattr(tf, HF_CLASSES[kind])(hf_config(kind, **over)).eval()
    with torch.no_grad():  # bigger than the 0.02 default so the logits are far from ties
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.15)
            else:
                p.uniform_(0.8, 1.2)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    tiny_tokenizer().save(str(path / "tokenizer.json"))
    return model
