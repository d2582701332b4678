"""What a generation endpoint answers, from the router's events for its request (completions.py
runs the request): one JSON body (`body`), or server-sent events (`stream`), one chunk per step's
tokens, the finish reason in the last chunk, `usage` in a final chunk when
`stream_options.include_usage` is set (and in every chunk with vLLM's `continuous_usage_stats`),
then `data: [DONE]`; a stream that fails (or is cut by shutdown) ends with an error event and
`data: [DONE]` too. Log-probabilities, where asked, in the forms of logprobs_io.py: a chunk's
with its tokens, the prompt's (echo, vLLM's prompt_logprobs) with the first.

The router's events: ("tokens", ids, their logprob records or None), ("done", finish reason),
("error", message, status[, code]).
"""

from __future__ import annotations

from .detokenize import Detokenizer
from .logprobs_io import TokenTexts, chat_logprobs, completion_logprobs, prompt_logprobs
from .openai_io import ApiError, ModelInfo, dumps
from .schema import GenRequest


def server_error(ev: tuple) -> ApiError:
    """The router's ("error", message, status[, code]) event as an ApiError."""
    status = ev[2]
    return ApiError(status, ev[1], "server_error" if status >= 500 else "invalid_request_error", None,
                    ev[3] if len(ev) > 3 else None)


def _echoed(gen: GenRequest, req) -> tuple | None:
    """With echo, the prompt's ids and logprob records, shown before the output's."""
    return (gen.prompt_ids, req.prompt_logprobs or []) if gen.echo_text is not None else None


def _prompt_logprobs(names: TokenTexts, gen: GenRequest, req) -> dict:
    """vLLM's prompt_logprobs field of a choice, where asked ({} otherwise)."""
    if gen.prompt_logprobs is None:
        return {}
    return {"prompt_logprobs": prompt_logprobs(names, req.prompt_logprobs or [], gen.prompt_logprobs)}


def _usage(gen: GenRequest, req, n_out: int) -> dict:
    n = len(gen.prompt_ids)
    return {"prompt_tokens": n, "completion_tokens": n_out, "total_tokens": n + n_out,
            "prompt_tokens_details": {"cached_tokens": req.cached_tokens}}


def body(info: ModelInfo, rid: str, created: int, chat: bool, gen: GenRequest, req, tokens: list[int],
         recs: list, text: str, reason: str) -> dict:
    """The JSON body of a finished request: its tokens, their records `recs` and its text."""
    names = TokenTexts(info.tokenizer)
    lps = None if gen.logprobs is None else chat_logprobs(names, recs, gen.logprobs) if chat else \
        completion_logprobs(names, recs, 0, gen.logprobs, _echoed(gen, req))
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": reason, "logprobs": lps, "token_ids": tokens}
    else:
        if gen.echo_text is not None:
            text = gen.echo_text + text
        choice = {"index": 0, "text": text, "token_ids": tokens, "logprobs": lps, "finish_reason": reason}
    choice.update(_prompt_logprobs(names, gen, req))
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": info.name, "choices": [choice], "usage": _usage(gen, req, len(tokens))}


async def stream(router, info: ModelInfo, req, first: tuple, rid: str, created: int, chat: bool, gen: GenRequest,
                 detok: Detokenizer):
    """The server-sent events of a request whose first event is `first`."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    head = f'{{"id":"{rid}","object":"{obj}","created":{created},"model":{dumps(info.name).decode()},'
    names, at = TokenTexts(info.tokenizer), [0]  # at: the text offset of the next token (completions' logprobs)
    extra = _prompt_logprobs(names, gen, req)   # into the first chunk

    def chunk(text: str, toks: list[int], reason: str | None, recs: list | None = None, echoed=None) -> str:
        lp = None
        if gen.logprobs is not None and (recs or echoed):
            lp = chat_logprobs(names, recs, gen.logprobs) if chat else \
                completion_logprobs(names, recs or [], at[0], gen.logprobs, echoed)
            if not chat:
                at[0] = lp["text_offset"][-1] + len(lp["tokens"][-1])
        if chat:
            delta = {"content": text} if text or toks else {}
            c = {"index": 0, "delta": delta, "token_ids": toks, "logprobs": lp, "finish_reason": reason}
        else:
            c = {"index": 0, "text": text, "token_ids": toks, "logprobs": lp, "finish_reason": reason}
        c.update(extra)
        extra.clear()
        return f"data: {head}\"choices\":[{dumps(c).decode()}]{usage_so_far()}}}\n\n"

    def usage_so_far() -> str:  # vLLM's continuous_usage_stats: the usage in every chunk
        if not gen.continuous_usage:
            return ""
        return f',"usage":{{"prompt_tokens":{n},"completion_tokens":{n_out},"total_tokens":{n + n_out}}}'

    n, n_out = len(gen.prompt_ids), 0
    ev = first
    try:
        if chat:
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                    "finish_reason": None, **extra}
            extra.clear()
            yield f"data: {head}\"choices\":[{dumps(role).decode()}]{usage_so_far()}}}\n\n"
        elif gen.echo_text:
            yield chunk(gen.echo_text, [], None, None, _echoed(gen, req))
        while True:
            if ev[0] == "tokens":
                n_out += len(ev[1])
                text = detok.push(ev[1])
                if detok.stopped:
                    router.cancel(req)
                    yield chunk(text, ev[1], "stop", ev[2])
                    break
                yield chunk(text, ev[1], None, ev[2])
            elif ev[0] == "done":
                yield chunk(detok.push([], final=True), [], ev[1])
                break
            else:
                yield f"data: {dumps(server_error(ev).body()).decode()}\n\n"
                break
            ev = await req.queue.get()
        if gen.include_usage:
            yield f"data: {head}\"choices\":[],\"usage\":{dumps(_usage(gen, req, n_out)).decode()}}}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        router.cancel(req)  # a no-op once the request has ended; stops the work if the client left
