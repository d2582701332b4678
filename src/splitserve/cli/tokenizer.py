"""`splitserve tokenizer export`: a preset's built-in tokenizer as a Hugging Face tokenizer directory
(engine/hf_export.py), for benchmark clients that load one (guidellm, aiperf)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(name="tokenizer", help="The built-in tokenizers, for clients that need a Hugging Face one.",
                  no_args_is_help=True)


@app.command("export")
def export(
    out: Annotated[Path, typer.Argument(metavar="DIR", help="Directory to write (created; its tokenizer files replaced).")],
    model: Annotated[str, typer.Option(help="A preset with a built-in tokenizer: tiny (or tiny-<N>l).")] = "tiny",
) -> None:
    """Write tokenizer.json, tokenizer_config.json (special tokens, context, chat template),
    special_tokens_map.json and config.json: transformers' AutoTokenizer.from_pretrained(DIR) loads it."""
    from ..engine.hf_export import export_tokenizer

    path = export_tokenizer(model, out)
    typer.echo(f"wrote the {model} tokenizer to {path}")
