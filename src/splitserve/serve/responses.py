"""What a generation endpoint answers, from the router's events for its request (completions.py
runs the request): one JSON body (`body`), or server-sent events (`stream`), one chunk per step's
tokens, the finish reason in the last chunk, `usage` in a final chunk when
`stream_options.include_usage` is set (and in every chunk with vLLM's `continuous_usage_stats`),
then `data: [DONE]`; a stream that fails (or is cut by shutdown) ends with an error event and
`data: [DONE]` too. Log-probabilities, where asked, in the forms of logprobs_io.py: a chunk's
with its tokens, the prompt's (echo, vLLM's prompt_logprobs) with the first. A chat request with
tools (and tool_choice not "none") gets its output parsed for tool calls (tools.py): in one body
as `message.tool_calls`; streamed, as OpenAI streams them (tool_stream.py): the text before a
call as content, then a delta naming the call (index, id, type, name, arguments ""), then its
arguments in fragments as they are written; finish reason "tool_calls".

The router's events, one queue for all the request's children (choices.py), each as (child index,
event): ("tokens", ids, their logprob records or None), ("done", finish reason), ("error", message,
status[, code]).
"""

from __future__ import annotations

from .choices import Choice, best
from .logprobs_io import TextOffsets, TokenTexts, chat_logprobs, completion_logprobs, prompt_logprobs
from .openai_io import ApiError, ModelInfo, dumps
from .schema import GenRequest
from .tool_stream import ToolStream, deltas, parse


def _with_calls(gen: GenRequest, text: str, reason: str | None) -> tuple[dict, str | None]:
    """({"content": ..., "tool_calls": [...] where any}, the finish reason) of a chat output
    with tools; "tool_calls" replaces a "stop" where the output made calls."""
    assert gen.tools is not None, "asked with tools"
    content, calls = parse(text, gen.tools)
    if not calls:
        return {"content": text}, reason
    return {"content": content, "tool_calls": calls}, "tool_calls" if reason == "stop" else reason


def server_error(ev: tuple) -> ApiError:
    """The router's ("error", message, status[, code]) event as an ApiError."""
    status = ev[2]
    return ApiError(status, ev[1], "server_error" if status >= 500 else "invalid_request_error", None,
                    ev[3] if len(ev) > 3 else None)


def _prompt_records(reqs: list) -> list:
    """The prompt's logprob records (one prompt for every child: whichever child's came first)."""
    return next((r.prompt_logprobs for r in reqs if r.prompt_logprobs is not None), [])


def _echoed(gen: GenRequest, prompt_recs: list) -> tuple | None:
    """With echo, the prompt's ids and logprob records, shown before the output's."""
    return (gen.prompt_ids, prompt_recs) if gen.echo_text is not None else None


def _prompt_logprobs(names: TokenTexts, gen: GenRequest, prompt_recs: list) -> dict:
    """vLLM's prompt_logprobs field of a choice, where asked ({} otherwise)."""
    if gen.prompt_logprobs is None:
        return {}
    return {"prompt_logprobs": prompt_logprobs(names, prompt_recs, gen.prompt_logprobs)}


def _usage(gen: GenRequest, reqs: list, n_out: int) -> dict:
    """Usage of the request: its prompt once, the tokens of every child (`best_of` too), and the
    prompt tokens the first child's prefill took from a prefix cache."""
    n = len(gen.prompt_ids)
    return {"prompt_tokens": n, "completion_tokens": n_out, "total_tokens": n + n_out,
            "prompt_tokens_details": {"cached_tokens": reqs[0].cached_tokens}}


def body(info: ModelInfo, rid: str, created: int, chat: bool, gen: GenRequest, reqs: list,
         choices: list[Choice]) -> dict:
    """The JSON body of a finished request from its children's `choices` (their texts decoded)."""
    names, prompt_recs = TokenTexts(info.tokenizer), _prompt_records(reqs)
    pl = _prompt_logprobs(names, gen, prompt_recs)
    out = []
    for index, c in enumerate(best(choices, gen.n)):
        text = c.detok.text()[0]
        lps = None if gen.logprobs is None else chat_logprobs(names, c.recs, gen.logprobs) if chat else \
            completion_logprobs(names, c.recs, TextOffsets(names), gen.logprobs, _echoed(gen, prompt_recs))
        if chat:
            msg, reason = _with_calls(gen, text, c.reason) if gen.tools and gen.tools.parses else \
                ({"content": text}, c.reason)
            choice = {"index": index, "message": {"role": "assistant", **msg},
                      "finish_reason": reason, "logprobs": lps, "token_ids": c.tokens}
        else:
            if gen.echo_text is not None:
                text = gen.echo_text + text
            choice = {"index": index, "text": text, "token_ids": c.tokens, "logprobs": lps, "finish_reason": c.reason}
        choice.update(pl)
        out.append(choice)
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": info.name, "choices": out, "usage": _usage(gen, reqs, sum(len(c.tokens) for c in choices))}


class Chunks:
    """The chunks of one request's stream: each choice's text offset (completions' logprobs), the
    fields its first chunk carries (vLLM's prompt_logprobs), the output tokens so far (`n_out`, usage)."""

    def __init__(self, info: ModelInfo, rid: str, created: int, chat: bool, gen: GenRequest, reqs: list) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = f'{{"id":"{rid}","object":"{obj}","created":{created},"model":{dumps(info.name).decode()},'
        self.chat, self.gen, self.reqs = chat, gen, reqs
        self.names, self.prompt_recs = TokenTexts(info.tokenizer), _prompt_records(reqs)  # the first event brought them
        self.at = [TextOffsets(self.names) for _ in reqs]  # each choice's text offsets (completions' logprobs)
        self.extra = [_prompt_logprobs(self.names, gen, self.prompt_recs)] * len(reqs)  # each choice's first chunk
        self.n, self.n_out = len(gen.prompt_ids), 0
        # chat with tools: each choice's output read for calls as it comes (tool_stream.py)
        self.tools = [ToolStream(gen.tools) for _ in reqs] if chat and gen.tools and gen.tools.parses else None

    def opening(self, k: int) -> str | None:
        """Choice k's first chunk before its tokens: chat's role; a completion's echoed prompt."""
        if self.chat:
            # with tools, no content yet (as OpenAI's): an answer that is only calls has none
            role = {"index": k, "delta": {"role": "assistant", "content": None if self.tools else ""}, "logprobs": None,
                    "finish_reason": None, **self.extra[k]}
            self.extra[k] = {}
            return f"data: {self.head}\"choices\":[{dumps(role).decode()}]{self.usage_so_far()}}}\n\n"
        if self.gen.echo_text:
            return self.chunk(k, self.gen.echo_text, [], None, None, _echoed(self.gen, self.prompt_recs))
        return None

    def chunk(self, i: int, text: str, toks: list[int], reason: str | None, recs: list | None = None,
              echoed=None) -> str:
        gen, lp = self.gen, None
        if gen.logprobs is not None and (recs or echoed):
            lp = chat_logprobs(self.names, recs or [], gen.logprobs) if self.chat else \
                completion_logprobs(self.names, recs or [], self.at[i], gen.logprobs, echoed)
        if self.tools is not None:
            return self._tool_chunks(i, text, toks, reason, lp)
        if self.chat:
            delta = {"content": text} if text or toks else {}
            c = {"index": i, "delta": delta, "token_ids": toks, "logprobs": lp, "finish_reason": reason}
        else:
            c = {"index": i, "text": text, "token_ids": toks, "logprobs": lp, "finish_reason": reason}
        c.update(self.extra[i])
        self.extra[i] = {}
        return f"data: {self.head}\"choices\":[{dumps(c).decode()}]{self.usage_so_far()}}}\n\n"

    def _tool_chunks(self, i: int, text: str, toks: list[int], reason: str | None, lp) -> str:
        """Choice i's next text with tools: a chunk per delta (content, a call's first delta, its
        arguments), the token ids and logprobs on the first, the finish reason on the last
        ("tool_calls" for a "stop" where the output made calls)."""
        assert self.tools is not None
        ts = self.tools[i]
        items = ts.push(text) + (ts.finish() if reason is not None else [])
        if reason == "stop" and ts.calls:
            reason = "tool_calls"
        out = []
        ds = deltas(items) or [{}]
        for k, d in enumerate(ds):
            c = {"index": i, "delta": d, "token_ids": toks if k == 0 else [], "logprobs": lp if k == 0 else None,
                 "finish_reason": reason if k == len(ds) - 1 else None, **(self.extra[i] if k == 0 else {})}
            out.append(f"data: {self.head}\"choices\":[{dumps(c).decode()}]{self.usage_so_far()}}}\n\n")
        self.extra[i] = {}
        return "".join(out)

    def usage_so_far(self) -> str:
        """vLLM's continuous_usage_stats: the usage in every chunk."""
        if not self.gen.continuous_usage:
            return ""
        n, n_out = self.n, self.n_out
        return f',"usage":{{"prompt_tokens":{n},"completion_tokens":{n_out},"total_tokens":{n + n_out}}}'

    def final_usage(self) -> str:
        """The last chunk with `stream_options.include_usage`: no choices, the usage."""
        usage = dumps(_usage(self.gen, self.reqs, self.n_out)).decode()
        return f"data: {self.head}\"choices\":[],\"usage\":{usage}}}\n\n"


async def stream(router, info: ModelInfo, reqs: list, q, choices: list[Choice], first: tuple, rid: str,
                 created: int, chat: bool, gen: GenRequest):
    """The server-sent events of a request's children (`best_of` is n here) from the first event
    `first` on: each chunk is one child's (its index), a chunk with the finish reason ends it."""
    out = Chunks(info, rid, created, chat, gen, reqs)
    left = len(reqs)
    i, ev = first
    try:
        for k in range(len(reqs)):
            opening = out.opening(k)
            if opening is not None:
                yield opening
        while True:
            c = choices[i]
            if c.reason is None:
                if ev[0] == "tokens":
                    out.n_out += len(ev[1])
                    text = c.detok.push(ev[1])
                    if c.detok.stopped:
                        router.cancel(reqs[i])
                        c.reason = "stop"
                    yield out.chunk(i, text, ev[1], c.reason, ev[2])
                elif ev[0] == "done":
                    c.reason = ev[1]
                    yield out.chunk(i, c.detok.push([], final=True), [], ev[1])
                else:
                    yield f"data: {dumps(server_error(ev).body()).decode()}\n\n"
                    break
                if c.reason is not None:
                    left -= 1
                    if not left:
                        break
            i, ev = await q.get()
        if gen.include_usage:
            yield out.final_usage()
        yield "data: [DONE]\n\n"
    finally:
        for req in reqs:
            router.cancel(req)  # a no-op once the request has ended; stops the work if the client left
