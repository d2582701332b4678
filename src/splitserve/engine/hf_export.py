"""A preset's built-in tokenizer written out as a Hugging Face tokenizer directory, for clients that
load one with `transformers.AutoTokenizer.from_pretrained(DIR)` (guidellm, aiperf, `vllm bench
serve`): `splitserve tokenizer export --model tiny DIR`, and `serve` writes it for its model (see
`client_tokenizer_dir`).

The directory holds
    tokenizer.json          the `tokenizers` tokenizer the server runs, as it is (vocabulary,
                            byte-level pre-tokenizer and decoder, special tokens, BOS post-processor)
    tokenizer_config.json   the special tokens, model_max_length = the preset's context, and a
                            chat template that renders the server's default chat prompt (CHAT_TEMPLATE)
    special_tokens_map.json the special tokens again (older transformers read them from here)
    config.json             the preset's shape as a Llama config.json (ModelConfig.from_hf_dict reads
                            it back to the same shape): clients that ask AutoConfig for the context
                            length find it

Only presets with a built-in tokenizer can be exported (today `tiny` and its `-<N>l` variants); a
model directory already is a tokenizer directory.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..errors import UserError
from .config import ModelConfig
from .presets import get_preset
from .tokenizer import TINY_SPECIALS, Tokenizer

# The server's DEFAULT CHAT TEMPLATE (serve/openai_io.py default_chat_text) in Jinja, with the BOS
# that the server's tokenizer adds to it written in front: transformers' apply_chat_template
# tokenizes the rendered text without adding special tokens, so its ids equal the server's.
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
                 "{{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def builtin_tokenizer(model: str) -> Tokenizer | None:
    """The tokenizer a preset is served with, or None when it has none (`small`, the Llama
    shapes: their vocabularies are sizes only). Raises UserError for an unknown preset."""
    get_preset(model)
    base = model.split("-")[0]
    if base == "tiny":
        return Tokenizer.tiny()
    return None


def hf_config(cfg: ModelConfig) -> dict:
    """A Llama config.json of a preset's shape (ModelConfig.from_hf_dict reads it back)."""
    out = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": list(cfg.eos_token_ids),
    }
    r = cfg.rope_scaling
    if r.kind != "default":
        out["rope_scaling"] = {"rope_type": r.kind, "factor": r.factor, "low_freq_factor": r.low_freq_factor,
                               "high_freq_factor": r.high_freq_factor,
                               "original_max_position_embeddings": r.original_max_position_embeddings}
    return out


def tokenizer_files(model: str) -> dict[str, str]:
    """File name -> text of the Hugging Face tokenizer directory of preset `model`."""
    if Path(model).is_dir():
        raise UserError(f"{model} is a model directory: its tokenizer files already are a Hugging Face "
                        "tokenizer directory; pass it to the client as it is")
    tok = builtin_tokenizer(model)
    if tok is None:
        raise UserError(f"preset {model!r} has no built-in tokenizer (its vocabulary is a size only); "
                        "only tiny (and tiny-<N>l) has one")
    cfg = get_preset(model)
    pad, bos, eos = TINY_SPECIALS
    specials = {"bos_token": bos, "eos_token": eos, "pad_token": pad}
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "model_max_length": cfg.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }

    def js(obj: dict) -> str:
        return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"

    return {
        "tokenizer.json": tok.tk.to_str(pretty=True),
        "tokenizer_config.json": js(tok_config),
        "special_tokens_map.json": js(specials),
        "config.json": js(hf_config(cfg)),
    }


def export_tokenizer(model: str, out: Path) -> Path:
    """Write the tokenizer directory of preset `model` to `out` (created; files there replaced, each
    atomically, so that servers writing the same directory at once leave it whole)."""
    files = tokenizer_files(model)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, out / name)
    except OSError as e:
        raise UserError(f"cannot write the tokenizer to {out}: {e.strerror or e}") from None
    return out


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/splitserve/tokenizers (~/.cache when unset)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "splitserve" / "tokenizers"


def client_tokenizer_dir(model: str, tokenizer_dir: Path | None) -> Path | None:
    """Where `serve --model MODEL` writes the tokenizer for clients (absolute, to be copied into a
    client's command line): `tokenizer_dir` when given, else default_cache_dir()/MODEL; None for a
    model directory or a preset without a tokenizer."""
    if Path(model).is_dir() or builtin_tokenizer(model) is None:
        return None
    return export_tokenizer(model, tokenizer_dir or default_cache_dir() / model).absolute()


def client_tokenizer_note(model: str, tokenizer_dir: Path | None) -> str | None:
    """The line `serve` prints about it: the path, or, when the default cache directory cannot be
    written, a warning (serving goes on; a --tokenizer-dir that cannot be written is an error)."""
    try:
        path = client_tokenizer_dir(model, tokenizer_dir)
    except UserError as e:
        if tokenizer_dir is not None:
            raise
        return f"warning: no tokenizer directory for clients ({e}); give --tokenizer-dir"
    if path is None:
        return None
    return f"the {model} tokenizer for clients (Hugging Face format): {path}"
