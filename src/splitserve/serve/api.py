"""The HTTP front end (FastAPI): OpenAI-compatible completions and chat, health and metrics.

    POST /v1/completions        prompt as text or token ids; "stream": true for SSE (completions.py)
    POST /v1/chat/completions   messages -> chat template (openai_io.py) -> completion
    GET  /v1/models, /health, /metrics (Prometheus), /debug/state (workers, KV blocks, policy)

Errors are OpenAI error bodies with 4xx for bad input; 429 (too many requests in flight) and 503
(no worker can serve) carry `Retry-After`. With an API key set, /v1/* and /debug/* need
`Authorization: Bearer KEY`. `/health` answers 503, naming the pool, while a pool that requests
need has no live worker (supervisor.py).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .completions import Completions, error_response, json_response
from .config import ServeConfig
from .metrics import ServeMetrics
from .openai_io import ApiError, ModelInfo
from .router import Router


class App(FastAPI):
    """FastAPI, plus a short path for the generation endpoints (completions.py)."""

    fast_routes: dict = {}  # path -> async handler(scope, receive, send), set by create_app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.fast_routes.get(scope["path"])
            if handler is not None:
                scope["app"] = self
                await handler(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(cfg: ServeConfig, log=None) -> App:
    from contextlib import asynccontextmanager

    info = ModelInfo.load(cfg.model)
    metrics = ServeMetrics()
    router = Router(cfg, metrics)
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
    gen = Completions(cfg, router, info, metrics, prep)

    def authorize(request: Request) -> None:
        gen.check_key(request.headers.get("authorization", ""))

    @app.exception_handler(ApiError)
    async def _apierror_response(request: Request, e: ApiError):
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def _httperror_response(request: Request, e: StarletteHTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return error_response(ApiError(e.status_code, str(e.detail), kind, None, None))

    @app.exception_handler(RequestValidationError)
    async def _validationerror_response(request: Request, e: RequestValidationError):
        return error_response(ApiError(400, str(e), "invalid_request_error"))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        return error_response(ApiError(500, f"internal error: {e!r}", "server_error", None, "internal_error"))

    # ---- small endpoints -------------------------------------------------------------------
    @app.get("/health")
    async def health():
        ok, body = router.health()
        return json_response(body, 200 if ok else 503)

    @app.get("/metrics")
    async def metrics_endpoint():
        return Response(metrics.render(router), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return json_response({"object": "list", "data": [{"id": info.name, "object": "model", "created": 0,
                                                  "owned_by": "splitserve", "max_model_len": info.max_model_len}]})

    @app.get("/debug/state")
    async def debug_state(request: Request):
        authorize(request)
        return json_response(router.debug_state())

    app.fast_routes = {"/v1/completions": gen.handler(False), "/v1/chat/completions": gen.handler(True)}
    return app
