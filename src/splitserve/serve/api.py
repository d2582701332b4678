"""The HTTP front end (FastAPI): OpenAI-compatible completions and chat, health and metrics.

    POST /v1/completions        prompt as text or token ids; "stream": true for SSE
    POST /v1/chat/completions   messages -> chat template (openai_io.py) -> completion
    GET  /v1/models, /health, /metrics (Prometheus), /debug/state (workers, KV blocks, policy)

Streams are server-sent events, one chunk per step's tokens (`choices[0].text` and
`choices[0].token_ids`), the finish reason in the last chunk, `usage` in a final chunk when
`stream_options.include_usage` is set, then `data: [DONE]`; a stream that fails (or is cut by
shutdown) ends with an error event and `data: [DONE]` too. Errors are OpenAI error bodies with 4xx
for bad input; 429 (too many requests in flight) and 503 (no worker can serve) carry
`Retry-After`. With an API key set, /v1/* and /debug/* need `Authorization: Bearer KEY`.

The two generation endpoints are served on a short path: `App.__call__` hands their POSTs straight
to one ASGI handler, without FastAPI's routing, dependency and middleware layers (37% of the
profile samples of a request's path through the app, benchmarks/serve/README.md). In order, it
checks the API key (401), the announced body size (413), reads the body up to the limit (413),
checks and tokenizes the request (schema.py; on a thread when the body is large, so that the
event loop, which also runs the router and its heartbeats, never stalls on one request), submits
it, and answers; a client that disconnects before its answer cancels its request.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .config import ServeConfig
from .detokenize import Detokenizer
from .metrics import ServeMetrics
from .openai_io import ApiError, ModelInfo, dumps
from .router import Overloaded, Router, TooLarge, Unavailable
from .schema import GenRequest, prepare

JSON = "application/json"
INLINE_BYTES = 4096  # bodies up to this size are checked and tokenized on the event loop itself
_ids = random.Random()  # response ids: unique, not secret (uuid4 costs a getrandom call each)


def _json(obj, status: int = 200, headers: dict | None = None) -> Response:
    return Response(dumps(obj), status_code=status, media_type=JSON, headers=headers)


def _error(e: ApiError) -> Response:
    return _json(e.body(), e.status, e.headers or None)


def _server_error(ev: tuple) -> ApiError:
    """The router's ("error", message, status[, code]) event as an ApiError."""
    status = ev[2]
    return ApiError(status, ev[1], "server_error" if status >= 500 else "invalid_request_error", None,
                    ev[3] if len(ev) > 3 else None)


class App(FastAPI):
    """FastAPI, plus a short path for the generation endpoints (see the module docstring)."""

    fast_routes: dict = {}  # path -> async handler(scope, receive, send), set by create_app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.fast_routes.get(scope["path"])
            if handler is not None:
                scope["app"] = self
                await handler(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than {limit} bytes (--max-body-mb)",
                    "invalid_request_error", None, "request_too_large", {"Connection": "close"})


async def _read_body(receive, limit: int) -> bytes | None:
    """The whole request body, or None if the client went away first; 413 past `limit` bytes."""
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            return None  # http.disconnect
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
        if not msg.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _cancel_when_gone(receive, task: asyncio.Task, left: list) -> None:
    """Once the body is read, uvicorn's next message is the client's disconnect: cancel `task`
    (the request's handler) then, and say so in `left`."""
    if (await receive())["type"] == "http.disconnect":
        left.append(True)
        task.cancel()


def create_app(cfg: ServeConfig, log=None) -> App:
    from contextlib import asynccontextmanager

    info = ModelInfo.load(cfg.model)
    metrics = ServeMetrics()
    router = Router(cfg, metrics)
    limits = cfg.limits
    prep = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="splitserve-prep")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await router.start()
        if cfg.worker_mode == "engine":  # what one request can hold: the context and the KV cache
            info.max_model_len = min(info.max_model_len, router.max_request_tokens())
        if log:
            log(f"{len(router.workers)} workers up ({', '.join(w.home for w in router.workers)}); "
                f"design {cfg.design}; router at {router.address}")
        try:
            yield
        finally:
            await router.stop()
            prep.shutdown(wait=False, cancel_futures=True)

    app = App(title="splitserve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.router, app.state.info, app.state.metrics = router, info, metrics
    key = cfg.api_key.encode() if cfg.api_key else None

    def authorize(request: Request) -> None:
        if key is not None:
            check_key(request.headers.get("authorization", ""))

    def check_key(auth: str) -> None:
        if not auth:
            raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'",
                           "invalid_request_error", None, "invalid_api_key")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key):
            raise ApiError(401, "incorrect API key", "invalid_request_error", None, "invalid_api_key")

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return _error(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return _error(ApiError(e.status_code, str(e.detail), kind, None, None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError):
        return _error(ApiError(400, str(e), "invalid_request_error"))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        return _error(ApiError(500, f"internal error: {e!r}", "server_error", None, "internal_error"))

    # ---- small endpoints -------------------------------------------------------------------
    @app.get("/health")
    async def health():
        ok, body = router.health()
        return _json(body, 200 if ok else 503)

    @app.get("/metrics")
    async def metrics_endpoint():
        return Response(metrics.render(router), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return _json({"object": "list", "data": [{"id": info.name, "object": "model", "created": 0,
                                                  "owned_by": "splitserve", "max_model_len": info.max_model_len}]})

    @app.get("/debug/state")
    async def debug_state(request: Request):
        authorize(request)
        return _json(router.debug_state())

    # ---- generation ------------------------------------------------------------------------
    def submit(gen: GenRequest, name: str):
        try:
            return router.submit(gen.prompt_ids, gen.params, name)
        except Overloaded as e:
            metrics.rejected.labels("429").inc()
            raise ApiError(429, f"server overloaded: {e}; retry later", "rate_limit_error", None,
                           "overloaded", {"Retry-After": str(cfg.retry_after_s)}) from None
        except TooLarge as e:
            raise ApiError(400, str(e), "invalid_request_error", "prompt", "context_length_exceeded") from None
        except Unavailable as e:
            metrics.rejected.labels("503").inc()
            raise ApiError(503, f"service unavailable: {e}", "server_error", None, "unavailable",
                           {"Retry-After": str(cfg.retry_after_s)}) from None

    async def generate(raw: bytes, chat: bool) -> Response:
        """The response to one completion (chat: True) request; ApiError for bad input."""
        if len(raw) <= INLINE_BYTES:
            gen = prepare(raw, chat, info, limits)
        else:
            gen = await asyncio.get_running_loop().run_in_executor(prep, prepare, raw, chat, info, limits)
        rid = f"{'chatcmpl-' if chat else 'cmpl-'}{_ids.getrandbits(96):024x}"
        req = submit(gen, rid)
        created = int(time.time())
        detok = Detokenizer(info.tokenizer, gen.stop)
        try:
            first = await req.queue.get()
        except BaseException:
            router.cancel(req)
            raise
        if first[0] == "error":
            raise _server_error(first)
        if gen.stream:
            return StreamingResponse(_stream(req, first, rid, created, chat, gen, detok),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        tokens: list[int] = []
        ev = first
        try:
            while True:
                if ev[0] == "tokens":
                    tokens += ev[1]
                    if gen.stop:  # else the text is decoded once, at the end
                        detok.push(ev[1])
                    if detok.stopped:
                        router.cancel(req)
                        reason = "stop"
                        break
                elif ev[0] == "done":
                    reason = ev[1]
                    break
                else:
                    raise _server_error(ev)
                ev = await req.queue.get()
        except BaseException:
            router.cancel(req)
            raise
        if not gen.stop:
            detok.push(tokens)
        text = detok.text()[0]
        n = len(gen.prompt_ids)
        usage = {"prompt_tokens": n, "completion_tokens": len(tokens), "total_tokens": n + len(tokens)}
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "finish_reason": reason, "logprobs": None, "token_ids": tokens}
            return _json({"id": rid, "object": "chat.completion", "created": created, "model": info.name,
                          "choices": [choice], "usage": usage})
        if gen.echo_text is not None:
            text = gen.echo_text + text
        choice = {"index": 0, "text": text, "token_ids": tokens, "logprobs": None, "finish_reason": reason}
        return _json({"id": rid, "object": "text_completion", "created": created, "model": info.name,
                      "choices": [choice], "usage": usage})

    async def _stream(req, first, rid, created, chat, gen: GenRequest, detok: Detokenizer):
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = f'{{"id":"{rid}","object":"{obj}","created":{created},"model":{dumps(info.name).decode()},'

        def chunk(text: str, toks: list[int], reason: str | None) -> str:
            if chat:
                delta = {"content": text} if text or toks else {}
                c = {"index": 0, "delta": delta, "token_ids": toks, "logprobs": None, "finish_reason": reason}
            else:
                c = {"index": 0, "text": text, "token_ids": toks, "logprobs": None, "finish_reason": reason}
            return f"data: {head}\"choices\":[{dumps(c).decode()}]}}\n\n"

        n_out = 0
        ev = first
        try:
            if chat:
                yield f"data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
            elif gen.echo_text:
                yield chunk(gen.echo_text, [], None)
            while True:
                if ev[0] == "tokens":
                    n_out += len(ev[1])
                    text = detok.push(ev[1])
                    if detok.stopped:
                        router.cancel(req)
                        yield chunk(text, ev[1], "stop")
                        break
                    yield chunk(text, ev[1], None)
                elif ev[0] == "done":
                    yield chunk(detok.push([], final=True), [], ev[1])
                    break
                else:
                    yield f"data: {dumps(_server_error(ev).body()).decode()}\n\n"
                    break
                ev = await req.queue.get()
            if gen.include_usage:
                n = len(gen.prompt_ids)
                usage = {"prompt_tokens": n, "completion_tokens": n_out, "total_tokens": n + n_out}
                yield f"data: {head}\"choices\":[],\"usage\":{dumps(usage).decode()}}}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            router.cancel(req)  # a no-op once the request has ended; stops the work if the client left

    # ---- the short path, called from App.__call__ -------------------------------------------
    def short_path(chat: bool):
        async def handle(scope, receive, send) -> None:
            try:
                auth, length = "", None
                for k, v in scope["headers"]:
                    if k == b"authorization":
                        auth = v.decode("latin-1")
                    elif k == b"content-length":
                        length = v
                if key is not None:
                    check_key(auth)  # before a byte of the body is read
                if length is not None and (not length.isdigit() or int(length) > limits.max_body_bytes):
                    raise too_large(limits.max_body_bytes)
                raw = await _read_body(receive, limits.max_body_bytes)
            except ApiError as e:
                await _error(e)(scope, receive, send)
                return
            if raw is None:
                return  # the client left before sending its request
            left: list[bool] = []
            watch = asyncio.ensure_future(_cancel_when_gone(receive, asyncio.current_task(), left))
            try:
                resp = await generate(raw, chat)
            except asyncio.CancelledError:
                if not left:
                    raise
                asyncio.current_task().uncancel()  # the client left: generate cancelled its request
                return
            except ApiError as e:
                resp = _error(e)
            except Exception as e:  # as FastAPI's stack does: an OpenAI 500 body, then re-raise
                await _error(ApiError(500, f"internal error: {e!r}", "server_error", None,
                                      "internal_error"))(scope, receive, send)
                raise
            finally:
                watch.cancel()
            await resp(scope, receive, send)
        return handle

    app.fast_routes = {"/v1/completions": short_path(False), "/v1/chat/completions": short_path(True)}
    return app
