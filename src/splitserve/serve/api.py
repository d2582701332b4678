"""The HTTP front end (FastAPI): OpenAI-compatible completions and chat, health and metrics.

    POST /v1/completions        prompt as text or token ids; "stream": true for SSE (completions.py)
    POST /v1/chat/completions   messages -> chat template (openai_io.py) -> completion
    POST /tokenize, /detokenize vLLM's: prompt or messages -> token ids; token ids -> text (schema.py)
    GET  /v1/models, /v1/models/{id} (404 for another model), /version
    GET  /health, /metrics (Prometheus), /debug/state (workers, KV blocks, policy)
    GET  /openapi.json, /docs   the OpenAPI schema (from the typed request models) and its Swagger UI

Errors are OpenAI error bodies with 4xx for bad input; 429 (too many requests in flight) and 503
(no worker can serve) carry `Retry-After`. With an API key set, /v1/*, /tokenize, /detokenize and
/debug/* need `Authorization: Bearer KEY`. `/health` answers 503, naming the pool, while a pool
that requests need has no live worker (supervisor.py).

The POST endpoints take the short path of completions.py, outside FastAPI's routing, so FastAPI
documents only the GET routes; `openapi_schema` adds the POST routes, their request bodies from
the pydantic models of bodies.py (the models that check them) and their error body.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .bodies import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, DetokenizeResponse, ResponsesRequest,
                     TokenizeChatRequest, TokenizeCompletionRequest, TokenizeResponse)
from .completions import Completions, error_response, json_response
from .config import ServeConfig
from .metrics import ServeMetrics
from .openai_io import ApiError, ModelInfo
from .router import Router
from .openai_responses import ResponsesEndpoint
from .schema import check_model

logger = logging.getLogger(__name__)

# path -> (summary, request models (one of), response model or None for a completion's JSON or SSE)
POST_ROUTES = {
    "/v1/completions": ("Completion (OpenAI); stream: true for server-sent events", (CompletionRequest,), None),
    "/v1/chat/completions": ("Chat completion (OpenAI); stream: true for server-sent events",
                             (ChatCompletionRequest,), None),
    "/tokenize": ("Token ids of a prompt or of chat messages (vLLM)",
                  (TokenizeCompletionRequest, TokenizeChatRequest), TokenizeResponse),
    "/detokenize": ("Text of token ids (vLLM)", (DetokenizeRequest,), DetokenizeResponse),
    "/v1/responses": ("A response (OpenAI's Responses API, over the chat path); stream: true for events",
                      (ResponsesRequest,), None),
}
_ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("splitserve")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from .. import __version__
        return __version__


def openapi_schema(app: FastAPI) -> dict:
    """FastAPI's schema of the app's routes, plus POST_ROUTES (see the module docstring)."""
    from fastapi.openapi.utils import get_openapi

    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    comps = schema.setdefault("components", {}).setdefault("schemas", {})
    for item in schema["paths"].values():  # bad input is a 400 with an OpenAI error body, never a 422
        for op in item.values():
            op["responses"].pop("422", None)
    comps.pop("HTTPValidationError", None)
    comps.pop("ValidationError", None)
    comps["ErrorResponse"] = _ERROR_SCHEMA
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}

    def ref(model) -> dict:
        js = model.model_json_schema(ref_template="#/components/schemas/{model}")
        comps.update(js.pop("$defs", {}))
        comps[model.__name__] = js
        return {"$ref": f"#/components/schemas/{model.__name__}"}

    for path, (summary, requests, response) in POST_ROUTES.items():
        refs = [ref(m) for m in requests]
        if response is not None:
            ok = {"description": "OK", "content": {"application/json": {"schema": ref(response)}}}
        else:
            ok = {"description": "one JSON body, or server-sent events (`data: {chunk}` ... `data: [DONE]`)",
                  "content": {"application/json": {}, "text/event-stream": {}}}
        schema["paths"][path] = {"post": {
            "summary": summary, "operationId": path.strip("/").replace("/", "_"),
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": refs[0] if len(refs) == 1 else {"anyOf": refs}}}},
            "responses": {"200": ok, "400": {"description": "bad request", **error},
                          "401": {"description": "missing or wrong API key", **error},
                          "404": {"description": "another model", **error},
                          "413": {"description": "body too large", **error}}}}
    return schema


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

    def openapi(self) -> dict[str, Any]:
        """The schema of openapi_schema (FastAPI's plus the short-path POST routes), made once."""
        if self.openapi_schema is None:
            self.openapi_schema = openapi_schema(self)
        return self.openapi_schema


def create_app(cfg: ServeConfig) -> App:
    """The server's app: its router (started and stopped with the app), the endpoints above."""
    info = ModelInfo.load(cfg.model)
    if cfg.chat_template is not None:
        info.chat_template = cfg.chat_template
    info.scores = cfg.worker_mode == "engine"
    metrics = ServeMetrics(info.name, info.max_model_len)
    router = Router(cfg, metrics)
    prep = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="splitserve-prep")
    app = App(title="splitserve", version=package_version(), lifespan=lifespan(cfg, router, info, prep),
              docs_url="/docs", redoc_url=None, openapi_url="/openapi.json",
              description="OpenAI-compatible phase-split (Splitwise) LLM serving")
    app.state.router, app.state.info, app.state.metrics = router, info, metrics
    gen = Completions(cfg, router, info, metrics, prep)
    app.state.refusal = gen.refusal  # the HTTP protocol's own 429 (shed.py; server.py)
    add_error_handlers(app)
    add_small_endpoints(app, router, info, metrics, gen)
    responses = ResponsesEndpoint(gen, info)
    add_responses_endpoint(app, gen, responses)
    app.fast_routes = {"/v1/completions": gen.handler(False), "/v1/chat/completions": gen.handler(True),
                       "/v1/responses": gen.endpoint(responses.create, shed=True),
                       "/tokenize": gen.endpoint(gen.tokenize), "/detokenize": gen.endpoint(gen.detokenize)}
    return app


def lifespan(cfg: ServeConfig, router: Router, info: ModelInfo, prep: ThreadPoolExecutor):
    """The app's lifespan: the router starts (its workers up) before the first request, stops after the last."""

    @asynccontextmanager
    async def run(app: FastAPI):
        await router.start()
        if cfg.worker_mode == "engine":  # what one request can hold: the context and the KV cache
            info.max_model_len = min(info.max_model_len, router.max_request_tokens())
        logger.info("%d workers up (%s); design %s; router at %s", len(router.workers),
                    ", ".join(w.home for w in router.workers), cfg.design, router.address)
        try:
            yield
        finally:
            await router.stop()
            prep.shutdown(wait=False, cancel_futures=True)

    return run


def add_error_handlers(app: App) -> None:
    """Every error as an OpenAI error body (a 400, never FastAPI's 422)."""

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


def add_responses_endpoint(app: App, gen: Completions, responses: ResponsesEndpoint) -> None:
    """GET /v1/responses/{id}: a response kept in memory (openai_responses.py)."""
    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request):
        gen.check_key(request.headers.get("authorization", ""))
        return json_response(responses.retrieve(response_id))


def add_small_endpoints(app: App, router: Router, info: ModelInfo, metrics: ServeMetrics, gen: Completions) -> None:
    """The GET endpoints: health, metrics, models, version, debug state."""

    def authorize(request: Request) -> None:
        gen.check_key(request.headers.get("authorization", ""))

    @app.get("/health")
    async def health():
        ok, body = router.views.health()
        return json_response(body, 200 if ok else 503)

    @app.get("/metrics")
    async def metrics_endpoint():
        return Response(metrics.render(router), media_type="text/plain; version=0.0.4")

    def model_card() -> dict:
        return {"id": info.name, "object": "model", "created": 0, "owned_by": "splitserve",
                "max_model_len": info.max_model_len}

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return json_response({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request):
        """The served model (`client.models.retrieve`); 404 in OpenAI's error shape for any other."""
        authorize(request)
        check_model(model_id, info)
        return json_response(model_card())

    @app.get("/version")
    async def version():
        return json_response({"version": app.version})

    @app.get("/debug/state")
    async def debug_state(request: Request):
        authorize(request)
        return json_response(router.views.debug_state())
