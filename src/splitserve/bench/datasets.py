"""The request sizes of `--dataset random` and the conversations of `--dataset sharegpt`.

random (as `vllm bench serve --dataset-name random`): each request's input and output lengths are
drawn uniformly from the integers in [floor(L (1 - r)), floor(L (1 + r))] for the lengths L
(`--random-input-len`, `--random-output-len`) and the range ratio r (`--random-range-ratio`,
0 <= r < 1; 0: every request the same), from `numpy.random.default_rng([seed, SALT])`. A length
of 0 is raised to 1.

sharegpt: the ShareGPT JSON format, a list of {"conversations": [{"from": "human", "value": ...},
{"from": "gpt", "value": ...}, ...]} (vLLM's reader). The prompt is the first human turn, the
output length the token count of the first gpt reply after it (vLLM takes turns 0 and 1; here a
conversation that does not start with a human turn has it found, and one without a human turn
followed by a gpt reply is skipped). Counting tokens needs the server's tokenizer (run.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import UserError

SIZE_SEED_SALT = 0x51E5
SHAREGPT_SEED_SALT = 0x5EA7
MIN_SHAREGPT_TOKENS = 4      # vLLM drops conversations whose prompt or reply is shorter


def random_sizes(n: int, input_len: int, output_len: int, range_ratio: float, seed: int) -> list[tuple[int, int]]:
    """`n` (prompt tokens, output tokens) pairs."""
    if not 0 <= range_ratio < 1:
        raise UserError(f"--random-range-ratio must be in [0, 1), got {range_ratio:g}")
    if input_len < 1 or output_len < 1:
        raise UserError(f"--random-input-len and --random-output-len must be at least 1, got "
                        f"{input_len} and {output_len}")
    rng = np.random.default_rng([seed, SIZE_SEED_SALT])

    def draw(length: int) -> np.ndarray:
        lo, hi = math.floor(length * (1 - range_ratio)), math.floor(length * (1 + range_ratio))
        return np.maximum(rng.integers(lo, hi + 1, n), 1)

    ins, outs = draw(input_len), draw(output_len)
    return list(zip(ins.tolist(), outs.tolist()))


class Conversation(NamedTuple):
    prompt: str      # the first human turn
    reply: str       # the first gpt reply after it


def read_sharegpt(path: str | Path) -> list[Conversation]:
    """Every usable conversation of a ShareGPT JSON file, in file order; a clear UserError when
    the file is missing, not JSON, not a list, or has no usable conversation."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--dataset-path {path}: file not found")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"--dataset-path {path}: not a JSON file ({e})") from None
    if not isinstance(data, list):
        raise UserError(f"--dataset-path {path}: expected a JSON list of {{\"conversations\": [...]}} objects "
                        f"(the ShareGPT format), got {type(data).__name__}")
    out = []
    for entry in data:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list):
            continue
        human = None
        for t in turns:
            if not isinstance(t, dict) or not isinstance(t.get("value"), str):
                continue
            if human is None and t.get("from") == "human":
                human = t["value"]
            elif human is not None and t.get("from") == "gpt":
                out.append(Conversation(human, t["value"]))
                break
    if not out:
        raise UserError(f"--dataset-path {path}: no conversation with a human turn followed by a gpt reply")
    return out


def sharegpt_order(n_conversations: int, seed: int) -> list[int]:
    """The order the conversations are used in: a seeded shuffle (vLLM shuffles too)."""
    return np.random.default_rng([seed, SHAREGPT_SEED_SALT]).permutation(n_conversations).tolist()
