"""The HTTP front end (FastAPI): OpenAI-compatible completions and chat, health and metrics.

    POST /v1/completions        prompt as text or token ids; "stream": true for SSE
    POST /v1/chat/completions   messages -> chat template (openai_io.py) -> completion
    GET  /v1/models, /health, /metrics (Prometheus), /debug/state (workers, KV blocks, policy)

Streams are server-sent events, one chunk per step's tokens (`choices[0].text` and
`choices[0].token_ids`), the finish reason in the last chunk, `usage` in a final chunk when
`stream_options.include_usage` is set, then `data: [DONE]`. Errors are OpenAI error bodies with
4xx for bad input; 429 (too many requests in flight) and 503 (no worker can serve) carry
`Retry-After`. With an API key set, /v1/* and /debug/* need `Authorization: Bearer KEY`.

The two generation endpoints are also served on a short path: `App.__call__` hands
`POST /v1/completions` and `POST /v1/chat/completions` straight to the same handler, without
FastAPI's routing, dependency and middleware layers (37% of the profile samples of a request's
path through the app, benchmarks/serve/README.md). Every other request, and every other method
on those paths, goes through FastAPI as usual; the FastAPI routes of the two endpoints stay, and
answer exactly as the short path does.
"""

from __future__ import annotations

import hmac
import random
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .config import ServeConfig
from .metrics import ServeMetrics
from .openai_io import ApiError, Detokenizer, ModelInfo, chat_prompt_ids, check_model, dumps, gen_options, \
    parse_json, prompt_ids
from .router import Overloaded, Router, Unavailable

JSON = "application/json"
_ids = random.Random()  # response ids: unique, not secret (uuid4 costs a getrandom call each)


def _json(obj, status: int = 200, headers: dict | None = None) -> Response:
    return Response(dumps(obj), status_code=status, media_type=JSON, headers=headers)


def _error(e: ApiError) -> Response:
    return _json(e.body(), e.status, e.headers or None)


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


async def _read_body(receive) -> bytes | None:
    """The whole request body, or None if the client went away first."""
    chunks = []
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            return None  # http.disconnect
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def create_app(cfg: ServeConfig, log=None) -> FastAPI:
    from contextlib import asynccontextmanager

    info = ModelInfo.load(cfg.model)
    metrics = ServeMetrics()
    router = Router(cfg, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await router.start()
        lens = [w.max_len for w in router.workers if w.max_len]
        if lens and cfg.worker_mode == "engine":
            info.max_model_len = min(info.max_model_len, *lens)
        if log:
            log(f"{len(router.workers)} workers up ({', '.join(w.home for w in router.workers)}); "
                f"design {cfg.design}; router at {router.address}")
        try:
            yield
        finally:
            await router.stop()

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
        up = sum(w.up for w in router.workers)
        ok = router.ready and up > 0
        return _json({"status": "ok" if ok else "unavailable", "workers_up": up,
                      "workers": len(router.workers)}, 200 if ok else 503)

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
    def submit(ids: list[int], params: dict):
        try:
            return router.submit(ids, params)
        except Overloaded as e:
            metrics.rejected.labels("429").inc()
            raise ApiError(429, f"server overloaded: {e}; retry later", "rate_limit_error", None,
                           "overloaded", {"Retry-After": str(cfg.retry_after_s)}) from None
        except Unavailable as e:
            metrics.rejected.labels("503").inc()
            raise ApiError(503, f"service unavailable: {e}", "server_error", None, "unavailable",
                           {"Retry-After": str(cfg.retry_after_s)}) from None

    async def generate(auth: str | None, raw: bytes, chat: bool) -> Response:
        """The response to one completion (chat: True) request; ApiError for bad input."""
        if key is not None:
            check_key(auth or "")
        body = parse_json(raw)
        check_model(body, info)
        ids = chat_prompt_ids(body, info) if chat else prompt_ids(body, info)
        opts = gen_options(body, info, len(ids), "max_completion_tokens" if chat else "max_tokens")
        req = submit(ids, opts.params)
        rid = f"{'chatcmpl-' if chat else 'cmpl-'}{_ids.getrandbits(96):024x}"
        created = int(time.time())
        detok = Detokenizer(info.tokenizer, opts.stop)
        try:
            first = await req.queue.get()
        except BaseException:
            router.cancel(req)
            raise
        if first[0] == "error":
            raise ApiError(first[2], first[1], "server_error" if first[2] >= 500 else "invalid_request_error")
        if opts.stream:
            return StreamingResponse(_stream(req, first, rid, created, chat, len(ids), detok, opts),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        tokens: list[int] = []
        ev = first
        try:
            while True:
                if ev[0] == "tokens":
                    tokens += ev[1]
                    detok.push(ev[1])
                    if detok.stopped:
                        router.cancel(req)
                        reason = "stop"
                        break
                elif ev[0] == "done":
                    reason = ev[1]
                    break
                else:
                    raise ApiError(ev[2], ev[1], "server_error" if ev[2] >= 500 else "invalid_request_error")
                ev = await req.queue.get()
        except BaseException:
            router.cancel(req)
            raise
        text = detok.text()[0]
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(tokens),
                 "total_tokens": len(ids) + len(tokens)}
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "finish_reason": reason, "logprobs": None, "token_ids": tokens}
            return _json({"id": rid, "object": "chat.completion", "created": created, "model": info.name,
                          "choices": [choice], "usage": usage})
        choice = {"index": 0, "text": text, "token_ids": tokens, "logprobs": None, "finish_reason": reason}
        return _json({"id": rid, "object": "text_completion", "created": created, "model": info.name,
                      "choices": [choice], "usage": usage})

    async def _stream(req, first, rid, created, chat, n_prompt, detok, opts):
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
                    err = ApiError(ev[2], ev[1], "server_error" if ev[2] >= 500 else "invalid_request_error")
                    yield f"data: {dumps(err.body()).decode()}\n\n"
                    break
                ev = await req.queue.get()
            if opts.include_usage:
                usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
                yield f"data: {head}\"choices\":[],\"usage\":{dumps(usage).decode()}}}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            router.cancel(req)  # a no-op once the request has ended; stops the work if the client left

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request.headers.get("authorization"), await request.body(), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request.headers.get("authorization"), await request.body(), chat=True)

    # ---- the short path: the same handler, called from App.__call__ ----------------------------
    def short_path(chat: bool):
        async def handle(scope, receive, send) -> None:
            auth = None
            if key is not None:
                for k, v in scope["headers"]:
                    if k == b"authorization":
                        auth = v.decode("latin-1")
                        break
            raw = await _read_body(receive)
            if raw is None:
                return  # the client left before sending its request
            try:
                resp = await generate(auth, raw, chat)
            except ApiError as e:
                resp = _error(e)
            except Exception as e:  # as FastAPI's stack does: an OpenAI 500 body, then re-raise
                await _error(ApiError(500, f"internal error: {e!r}", "server_error", None,
                                      "internal_error"))(scope, receive, send)
                raise
            await resp(scope, receive, send)
        return handle

    app.fast_routes = {"/v1/completions": short_path(False), "/v1/chat/completions": short_path(True)}
    return app
