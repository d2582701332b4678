"""The options of a live benchmark (`BenchOptions`, one per `splitserve bench` flag) and their
checks: `validate` refuses a bad combination in one line (a UserError) before anything is sent;
`base_url` the server's address."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import UserError
from ..workload.conversations import SHAPES, parse_shape

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
DATASETS = ("workload", "random", "sharegpt")


@dataclass(slots=True)
class BenchOptions:
    url: str
    workload: str = "coding"
    rps: float = 1.0
    duration: float | None = 10.0
    out: str | Path | None = None
    seed: int = 0
    arrivals: str = "auto"
    model: str | None = None
    api_key: str | None = None
    max_tokens_cap: int | None = None
    max_prompt_tokens: int | None = None
    max_context: int | None = None
    token_id_min: int = 1
    token_id_max: int = 255
    timeout: float = 300.0
    max_connections: int = 1000
    ignore_eos: bool = True
    progress: bool = False
    keep_records: bool = True
    endpoint: str = "completions"
    prompt_format: str | None = None          # ids | text; None: ids for completions, text for chat
    dataset: str = "workload"
    dataset_path: str | None = None
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    num_prompts: int | None = None
    burstiness: float = 1.0
    max_concurrency: int | None = None
    goodput: list[str] | None = None
    percentiles: str = "50,90,99"
    server_check: bool = True
    clip_to_context: bool = False
    save_outputs: bool = False
    conversation: str | None = None           # multiturn, sysprompt: the shape (workload/conversations.py)

    @property
    def fmt(self) -> str:
        return self.prompt_format or ("text" if self.endpoint == "chat" else "ids")


def check(cond: bool, msg: str) -> None:
    """A UserError saying `msg` unless `cond`."""
    if not cond:
        raise UserError(msg)


def base_url(url: str) -> str:
    """`http://host:port` (a trailing `/v1`, `/v1/completions` or `/v1/chat/completions` is
    accepted and dropped)."""
    u = url.strip().rstrip("/")
    parts = urlsplit(u)
    check(parts.scheme in ("http", "https") and bool(parts.netloc),
           f"--url must look like http://HOST:PORT, got {url!r}")
    for tail in (*ENDPOINTS.values(), "/v1"):
        if u.endswith(tail):
            u = u[: -len(tail)]
            break
    return u


def validate(o: BenchOptions) -> None:
    check(o.duration is not None or o.dataset != "workload" or o.workload not in SHAPES,
          f"--workload {o.workload} starts conversations for --duration seconds: give --duration")
    check(math.isfinite(o.rps) and o.rps > 0, f"--rps must be a positive number, got {o.rps:g}")
    check(o.duration is not None or o.num_prompts is not None, "give --duration (seconds of arrivals) or --num-prompts")
    check(o.duration is None or (math.isfinite(o.duration) and o.duration > 0),
           f"--duration must be positive seconds, got {o.duration}")
    check(o.num_prompts is None or o.num_prompts >= 1, f"--num-prompts must be at least 1, got {o.num_prompts}")
    check(math.isfinite(o.timeout) and o.timeout > 0, f"--timeout must be positive seconds, got {o.timeout:g}")
    check(o.max_tokens_cap is None or o.max_tokens_cap >= 1,
           f"--max-tokens-cap must be at least 1, got {o.max_tokens_cap}")
    check(o.max_prompt_tokens is None or o.max_prompt_tokens >= 1,
           f"--max-prompt-tokens must be at least 1, got {o.max_prompt_tokens}")
    check(0 <= o.token_id_min <= o.token_id_max,
           f"token ids must satisfy 0 <= --token-id-min <= --token-id-max, got {o.token_id_min}..{o.token_id_max}")
    check(o.max_connections >= 1, f"--max-connections must be at least 1, got {o.max_connections}")
    check(o.endpoint in ENDPOINTS, f"--endpoint must be completions or chat, got {o.endpoint!r}")
    check(o.prompt_format in (None, "ids", "text"), f"--prompt-format must be ids or text, got {o.prompt_format!r}")
    check(not (o.endpoint == "chat" and o.fmt == "ids"),
           "--endpoint chat sends text messages: use --prompt-format text (the default for chat)")
    check(o.dataset in DATASETS, f"--dataset must be one of {', '.join(DATASETS)}, got {o.dataset!r}")
    check((o.dataset == "sharegpt") == (o.dataset_path is not None),
           "--dataset sharegpt needs --dataset-path FILE.json" if o.dataset == "sharegpt"
           else "--dataset-path goes with --dataset sharegpt")
    check(math.isfinite(o.burstiness) and o.burstiness > 0, f"--burstiness must be positive, got {o.burstiness:g}")
    check(o.max_concurrency is None or o.max_concurrency >= 1,
           f"--max-concurrency must be at least 1, got {o.max_concurrency}")
    if o.dataset == "workload" and o.workload in SHAPES:
        _validate_conversations(o)
    else:
        check(o.conversation is None, f"--conversation shapes the conversations of --workload {' or '.join(SHAPES)}")


def _validate_conversations(o: BenchOptions) -> None:
    w = f"--workload {o.workload}"
    check(o.endpoint == "completions" and o.fmt == "ids",
          f"{w} sends each turn's history as token ids: use --endpoint completions --prompt-format ids")
    check(o.duration is not None and o.num_prompts is None,
          f"{w} starts conversations for --duration seconds (every one runs to its end); --num-prompts does not apply")
    check(o.burstiness == 1.0 and o.arrivals in ("auto", "poisson"),
          f"{w} starts conversations at Poisson arrivals; --burstiness and --arrivals trace do not apply")
    check(o.max_prompt_tokens is None and o.max_tokens_cap is None,
          f"{w}: size turns with --conversation (user=LO:HI,reply=LO:HI), not --max-prompt-tokens/--max-tokens-cap")
    parse_shape(SHAPES[o.workload], o.conversation or "")
