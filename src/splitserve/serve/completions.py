"""The two generation endpoints, `POST /v1/completions` and `POST /v1/chat/completions`, served
on a short path: `App.__call__` (api.py) hands their POSTs straight to `Completions.handler`,
without FastAPI's routing, dependency and middleware layers (the larger part of a request's
cost in the app). vLLM's `POST /tokenize` and
`POST /detokenize` take the same path (`Completions.endpoint`), so that their bodies are bounded,
and their API key checked, alike.

In order, a request's handler checks the API key (401), the announced body size (413), reads the
body up to the limit (413), checks and tokenizes the request (schema.py; on a thread when the body
is large, so that the event loop, which also runs the router and its heartbeats, never stalls on
one request), submits it to the router, and answers: one JSON body, or server-sent events
(responses.py). A client that disconnects before its answer cancels its request.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from concurrent.futures import Executor

from fastapi.responses import Response, StreamingResponse

from .choices import Choice, Failed, Tagged, child_params, collect
from .config import ServeConfig
from .detokenize import Detokenizer
from .ids import unique_hex
from .metrics import ServeMetrics
from .openai_io import ApiError, ModelInfo, dumps
from .responses import body, server_error, stream
from .router import Overloaded, Router, TooLarge, Unavailable, full
from .schema import GenRequest, detokenize, prepare, tokenize

JSON = "application/json"
SHED_PATHS = frozenset((b"/v1/completions", b"/v1/chat/completions", b"/v1/responses"))  # the generations
INLINE_BYTES = 4096  # bodies up to this size are checked and tokenized on the event loop itself
logger = logging.getLogger(__name__)


def json_response(obj, status: int = 200, headers: dict | None = None) -> Response:
    return Response(dumps(obj), status_code=status, media_type=JSON, headers=headers)


def error_response(e: ApiError) -> Response:
    return json_response(e.body(), e.status, e.headers or None)


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


def raw_response(status: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    """A whole HTTP/1.1 response: status line (`429 Too Many Requests`), headers, body."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers)
    return f"HTTP/1.1 {status}\r\n{head}content-length: {len(body)}\r\n\r\n".encode("latin-1") + body


def _auth_and_length(headers) -> tuple[str, bytes | None]:
    """A request's Authorization header ("" when none) and Content-Length (None when none)."""
    auth, length = "", None
    for k, v in headers:
        if k == b"authorization":
            auth = v.decode("latin-1")
        elif k == b"content-length":
            length = v
    return auth, length


async def _cancel_when_gone(receive, task: asyncio.Task, left: list) -> None:
    """Once the body is read, uvicorn's next message is the client's disconnect: cancel `task`
    (the request's handler) then, and say so in `left`."""
    if (await receive())["type"] == "http.disconnect":
        left.append(True)
        task.cancel()


class Completions:
    """The generation endpoints of one server: its router, model, limits and API key."""

    def __init__(self, cfg: ServeConfig, router: Router, info: ModelInfo, metrics: ServeMetrics,
                 prep: Executor) -> None:
        self.cfg, self.router, self.info, self.metrics, self.prep = cfg, router, info, metrics, prep
        self.limits = cfg.limits
        self.key = cfg.api_key.encode() if cfg.api_key else None

    def check_key(self, auth: str) -> None:
        """401 unless `auth` is "Bearer <the key>" (no key set: anyone)."""
        if self.key is None:
            return
        if not auth:
            raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'",
                           "invalid_request_error", None, "invalid_api_key")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.key):
            raise ApiError(401, "incorrect API key", "invalid_request_error", None, "invalid_api_key")

    def submit(self, gen: GenRequest, name: str, q: asyncio.Queue, children: range) -> list:
        """These children of the request (n, or best_of) to the router, their events into `q`
        (choices.py); none of them if any is refused."""
        k = gen.best_of or gen.n
        reqs = []
        try:
            for i in children:
                params = gen.params if k == 1 else child_params(gen.params, i, k > gen.n)
                reqs.append(self.router.submit(gen.prompt_ids, params, name, Tagged(q, i), gen.cache_key))
            return reqs
        except Overloaded as e:
            raise self.overloaded(str(e)) from None
        except TooLarge as e:
            raise ApiError(400, str(e), "invalid_request_error", "prompt", "context_length_exceeded") from None
        except Unavailable as e:
            self.metrics.splitwise.rejected.labels("503").inc()
            raise ApiError(503, f"service unavailable: {e}", "server_error", None, "unavailable",
                           {"Retry-After": str(self.cfg.retry_after_s)}) from None
        finally:
            if len(reqs) < len(children):
                for r in reqs:
                    self.router.cancel(r)

    def overloaded(self, why: str) -> ApiError:
        """The 429 of a request refused for the requests in flight (counted)."""
        self.metrics.splitwise.rejected.labels("429").inc()
        return ApiError(429, f"server overloaded: {why}; retry later", "rate_limit_error", None, "overloaded",
                        {"Retry-After": str(self.cfg.retry_after_s)})

    def refusal(self, path: bytes, headers: list[tuple[bytes, bytes]]) -> bytes | None:
        """The whole 429 of a generation that a full server refuses as its headers are read
        (shed.py), or None where the usual path answers: not full, not a generation, an API key
        missing or wrong (401 first), a body announced too large (413 first)."""
        if path not in SHED_PATHS or not full(self.router):
            return None
        auth, length = _auth_and_length(headers)
        if length is not None and (not length.isdigit() or int(length) > self.limits.max_body_bytes):
            return None
        if self.key is not None:
            try:
                self.check_key(auth)
            except ApiError:
                return None
        e = self.overloaded(f"{self.cfg.max_queue} requests in flight (the limit)")
        return raw_response("429 Too Many Requests", [("content-type", JSON), *e.headers.items()], dumps(e.body()))

    async def _prepared(self, fn, raw: bytes, *args):
        """fn(raw, *args): on the event loop for a small body, else on the prep threads."""
        if len(raw) <= INLINE_BYTES:
            return fn(raw, *args)
        return await asyncio.get_running_loop().run_in_executor(self.prep, fn, raw, *args)

    async def tokenize(self, raw: bytes) -> Response:
        return json_response(await self._prepared(tokenize, raw, self.info))

    async def detokenize(self, raw: bytes) -> Response:
        return json_response(await self._prepared(detokenize, raw, self.info))

    async def generate(self, raw: bytes, chat: bool) -> Response:
        """The response to one completion (chat: True) request; ApiError for bad input."""
        gen = await self._prepared(prepare, raw, chat, self.info, self.limits)
        rid = f"{'chatcmpl-' if chat else 'cmpl-'}{unique_hex()}"
        if logger.isEnabledFor(logging.DEBUG):  # vLLM's request log, off unless asked (--log-level debug)
            logger.debug("%s: %d prompt tokens, max_tokens %d, %d choices%s", rid, len(gen.prompt_ids),
                         gen.params.max_tokens, gen.best_of or gen.n, f", user {gen.user!r}" if gen.user else "")
        q: asyncio.Queue = asyncio.Queue()
        k = gen.best_of or gen.n
        # with prefix caches, the other children follow the first one's first token, as SGLang's
        # parallel sampling does: its prompt's full blocks are cached by then (choices.py)
        reqs = self.submit(gen, rid, q, range(1 if self.cfg.prefix_caching else k))
        created = int(time.time())
        choices = [Choice(Detokenizer(self.info.tokenizer, gen.stop, gen.include_stop, gen.skip_special,
                                      gen.params.min_tokens)) for _ in range(k)]
        try:
            first = await q.get()
            if first[1][0] == "error":
                raise Failed(first[1])
            if len(reqs) < k:
                reqs += self.submit(gen, rid, q, range(1, k))
            if gen.stream:
                return StreamingResponse(stream(self.router, self.info, reqs, q, choices, first, rid, created, chat,
                                                gen), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            await collect(self.router, reqs, q, choices, first)
        except BaseException as e:
            for r in reqs:
                self.router.cancel(r)
            if isinstance(e, Failed):
                raise server_error(e.ev) from None
            raise
        for c in choices:
            if not c.detok.stop:
                c.detok.push(c.tokens)
        return json_response(body(self.info, rid, created, chat, gen, reqs, choices))


    def handler(self, chat: bool):
        """The ASGI handler of one generation endpoint (chat: True for /v1/chat/completions)."""
        return self.endpoint(lambda raw: self.generate(raw, chat), shed=True)

    def endpoint(self, respond, shed: bool = False):
        """The ASGI handler of a POST endpoint whose response is `await respond(raw body)`; `shed`:
        a generation, refused with 429 before its body is parsed while the router is full (a refusal
        costs the front end no parsing, tokenizing or checking)."""
        async def handle(scope, receive, send) -> None:
            try:
                auth, length = _auth_and_length(scope["headers"])
                if self.key is not None:
                    self.check_key(auth)  # before a byte of the body is read
                if length is not None and (not length.isdigit() or int(length) > self.limits.max_body_bytes):
                    raise too_large(self.limits.max_body_bytes)
                raw = await _read_body(receive, self.limits.max_body_bytes)
                if shed and raw is not None and full(self.router):   # read (the connection stays
                    raise self.overloaded(f"{self.cfg.max_queue} requests in flight (the limit)")  # usable), not parsed
            except ApiError as e:
                await error_response(e)(scope, receive, send)
                return
            if raw is None:
                return  # the client left before sending its request
            left: list[bool] = []
            task = asyncio.current_task()
            assert task is not None  # an ASGI handler runs in a task
            watch = asyncio.ensure_future(_cancel_when_gone(receive, task, left))
            try:
                resp = await respond(raw)
            except asyncio.CancelledError:
                if not left:
                    raise
                task.uncancel()  # the client left: generate cancelled its request
                return
            except ApiError as e:
                resp = error_response(e)
            except Exception as e:  # as FastAPI's stack does: an OpenAI 500 body, then re-raise
                await error_response(ApiError(500, f"internal error: {e!r}", "server_error", None,
                                              "internal_error"))(scope, receive, send)
                raise
            finally:
                watch.cancel()
            await resp(scope, receive, send)
        return handle

