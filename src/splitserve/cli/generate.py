"""`splitserve generate`: one completion with splitserve's own engine (paged KV cache).

    splitserve generate --model tiny --prompt "Hello" --max-tokens 16 --json
    splitserve generate --model /path/to/hf-dir --prompt-ids 1,2,3 --max-tokens 8

`--model` is a local Hugging Face directory (config.json + *.safetensors [+ tokenizer.json]) or a
preset (random weights from --seed; `tiny` brings its own byte-level tokenizer). With --json the
output is {"token_ids": [...], "text": ...} (text is null without a tokenizer). The engine is
the `engine` extra's: it is imported when a completion is asked for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Annotated, Optional

import typer

from ..errors import UserError
from .lists import ListedHelp

app = typer.Typer()


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    model: str = "tiny"
    prompt: str | None = None         # text (needs the model's tokenizer) ...
    prompt_ids: str | None = None     # ... or token ids, "1,2,3": exactly one of the two
    max_tokens: int = 16
    temperature: float = 0.0
    seed: int = 0
    json_out: bool = False
    device: str = "auto"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise UserError(f"--max-tokens must be at least 1, got {self.max_tokens}")
        if (self.prompt is None) == (self.prompt_ids is None):
            raise UserError("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")


def run_generate(req: GenerateRequest) -> int:
    """Generate and print the completion (JSON with --json, else its text, or its token ids)."""
    if find_spec("torch") is None:
        raise UserError("the engine needs torch, safetensors and tokenizers: in the splitserve checkout run "
                        "pip install torch==2.13.0 '.[engine]' (CPU PyTorch; with a GPU, install your "
                        "CUDA build of torch first and leave out the pin)")
    from ..engine.engine import EngineConfig, LLMEngine
    from ..engine.sampler import SamplingParams
    from ..engine.tokenizer import parse_token_ids

    params = SamplingParams(max_tokens=req.max_tokens, temperature=req.temperature, seed=req.seed)
    engine = LLMEngine(req.model, EngineConfig(device=req.device, dtype=req.dtype, seed=req.seed, max_num_seqs=1))
    if req.prompt_ids is not None:
        ids = parse_token_ids(req.prompt_ids)
    else:
        assert req.prompt is not None, "GenerateRequest holds exactly one of the two"
        ids = engine.encode(req.prompt)
    out = engine.generate([ids], params)[0]
    if req.json_out:
        print(json.dumps({"token_ids": out.token_ids, "text": out.text}))
    else:
        print(out.text if out.text is not None else " ".join(map(str, out.token_ids)))
    return 0


@app.command(cls=ListedHelp)
def generate(
    model: Annotated[str, typer.Option(help="A Hugging Face-format directory (config.json + *.safetensors) or a preset: {presets} (add -<N>l for N layers, e.g. llama2-70b-8l).")] = "tiny",
    prompt: Annotated[Optional[str], typer.Option(help="Prompt text (needs the model's tokenizer).")] = None,
    prompt_ids: Annotated[Optional[str], typer.Option("--prompt-ids", help="Prompt as token ids: 1,2,3.")] = None,
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate at most.")] = 16,
    temperature: Annotated[float, typer.Option(help="0 for greedy decoding.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the sampler (preset weights are always the same).")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help='Print {"token_ids": [...], "text": ...}.')] = False,
    device: Annotated[str, typer.Option(help="cpu, cuda or auto.")] = "auto",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16 or auto.")] = "auto",
) -> None:
    """Generate one completion with splitserve's own engine (paged KV cache)."""
    run_generate(GenerateRequest(model=model, prompt=prompt, prompt_ids=prompt_ids, max_tokens=max_tokens,
                                 temperature=temperature, seed=seed, json_out=json_out, device=device, dtype=dtype))
