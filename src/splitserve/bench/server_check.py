"""What the server says before a run: `preflight` (anything answering, the API key accepted, the
models it serves), `choose_model` (the model to send and its context), `check_context` (a plan
whose requests cannot fit that context is refused in one line)."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import UserError


def preflight(base: str, api_key: str | None, timeout: float = 5.0) -> list[dict]:
    """Fail early, in one line, when nothing answers at `base`; return the served models
    (`GET /v1/models`'s `data`, each a dict with an `id`; empty when the server does not list them)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        r = httpx.get(base + "/v1/models", headers=headers, timeout=timeout)
    except httpx.HTTPError as e:
        raise UserError(f"cannot reach the server at {base}: {type(e).__name__}: {e}") from None
    if r.status_code in (401, 403):
        raise UserError(f"the server at {base} refused the API key (HTTP {r.status_code}); give --api-key")
    if r.status_code != 200:
        return []
    try:
        return [m for m in r.json().get("data", []) if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except (ValueError, AttributeError):
        return []


def choose_model(models: list[dict], wanted: str | None, base: str, check: bool) -> tuple[str | None, int | None]:
    """(model name to send, its context length or None)."""
    if wanted is None:
        m = models[0] if models else None
    else:
        m = next((x for x in models if x["id"] == wanted), None)
        if m is None and models and check:
            raise UserError(f"the server at {base} does not serve the model '{wanted}' (it serves: "
                            f"{', '.join(x['id'] for x in models)}); fix --model, or send anyway with --no-server-check")
    name = wanted if wanted is not None else (m["id"] if m else None)
    ctx = m.get("max_model_len") if m else None
    return name, ctx if isinstance(ctx, int) and ctx > 0 else None


def check_context(plan: Iterable, ctx: int) -> None:
    """Refuse (one line) a plan with a request whose prompt + output exceeds `ctx`."""
    over = total = 0
    longest: tuple[int, int] | None = None   # the longest request over `ctx`: (prompt, output) tokens
    for r in plan:
        total += 1
        n = r.prompt_tokens + r.max_tokens
        if n > ctx:
            over += 1
            if longest is None or n > longest[0] + longest[1]:
                longest = (r.prompt_tokens, r.max_tokens)
    if longest is not None:
        raise UserError(f"{over:,} of {total:,} requests need more than the server's context of {ctx:,} tokens "
                        f"(the longest: {longest[0]:,} prompt + {longest[1]:,} output tokens); cap them with "
                        f"--max-prompt-tokens and --max-tokens-cap, clip them with --clip-to-context, or send "
                        f"them anyway with --no-server-check")
