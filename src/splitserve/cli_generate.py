"""`splitserve generate`: one-off generation with the inference engine.

    splitserve generate --model tiny --prompt "Hello" --max-tokens 16 --json
    splitserve generate --model /path/to/hf-dir --prompt-ids 1,2,3 --max-tokens 8

`--model` is a local Hugging Face directory (config.json + *.safetensors [+ tokenizer.json]) or a
preset (random weights from --seed; `tiny` brings its own byte-level tokenizer). With --json the
output is {"token_ids": [...], "text": ...} (text is null without a tokenizer).
"""

from __future__ import annotations

import json

from .errors import UserError


def generate_command(model: str, prompt: str | None, prompt_ids: str | None, max_tokens: int,
                     temperature: float, seed: int, json_out: bool, device: str, dtype: str) -> int:
    if (prompt is None) == (prompt_ids is None):
        raise UserError("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UserError("the engine needs torch, safetensors and tokenizers: in the splitserve checkout run "
                        "pip install torch==2.13.0 '.[engine]' (CPU PyTorch; with a GPU, install your "
                        "CUDA build of torch first and leave out the pin)") from None
    from .engine.engine import LLMEngine
    from .engine.sampler import SamplingParams
    from .engine.tokenizer import parse_token_ids

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    engine = LLMEngine(model, device=device, dtype=dtype, seed=seed, max_num_seqs=1)
    ids = parse_token_ids(prompt_ids) if prompt_ids is not None else engine.encode(prompt)
    out = engine.generate([ids], params)[0]
    if json_out:
        print(json.dumps({"token_ids": out.token_ids, "text": out.text}))
    else:
        print(out.text if out.text is not None else " ".join(map(str, out.token_ids)))
    return 0
