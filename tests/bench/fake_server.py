"""A TEST DOUBLE of splitserve's real server (which lives in `src/splitserve/serve/`): just the
OpenAI streaming-completions wire shape, with known, deterministic delays and scripted failures,
so the bench's client-side measurements can be checked against numbers known in advance.

Each request: first token `first_token_s` after arrival, then one token every `token_gap_s`,
exactly `max_tokens` tokens, one SSE chunk per token, `usage` in the last chunk, `data: [DONE]`.
`behaviour(n, body)` picks per arrival (n = 0, 1, ... in order of arrival at the server):
"ok", "reject" (HTTP 429), "unavailable" (503), "error" (500), or "drop" (the connection is cut
after `drop_after` tokens, without [DONE]). Arrival times (time.perf_counter, the clock the bench
uses too) and request bodies are recorded.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


@dataclass
class FakeServer:
    first_token_s: float = 0.050
    token_gap_s: float = 0.010
    drop_after: int = 2
    behaviour: Callable[[int, dict], str] = lambda n, body: "ok"
    send_usage: bool = True
    arrivals: list[float] = field(default_factory=list)
    bodies: list[dict] = field(default_factory=list)
    port: int = 0

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

        @app.post("/v1/completions")
        async def completions(request: Request):
            t = time.perf_counter()
            body = await request.json()
            n = len(self.arrivals)
            self.arrivals.append(t)
            self.bodies.append(body)
            what = self.behaviour(n, body)
            if what == "reject":
                return JSONResponse({"error": {"message": "overloaded"}}, status_code=429)
            if what == "unavailable":
                return JSONResponse({"error": {"message": "no capacity"}}, status_code=503)
            if what == "error":
                return JSONResponse({"error": {"message": "boom"}}, status_code=500)
            return StreamingResponse(self._stream(t, body, what), media_type="text/event-stream")

        return app

    async def _stream(self, t0: float, body: dict, what: str):
        n = int(body["max_tokens"])
        for i in range(n):
            # sleep to an absolute deadline so delays do not accumulate jitter
            deadline = t0 + self.first_token_s + i * self.token_gap_s
            await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
            if what == "drop" and i == self.drop_after:
                raise ConnectionAbortedError("test double cuts the stream")
            chunk = {"id": "cmpl-x", "object": "text_completion", "model": "fake-model",
                     "choices": [{"index": 0, "text": f" t{i}",
                                  "finish_reason": "length" if i == n - 1 else None}]}
            if i == n - 1 and self.send_usage:
                chunk["usage"] = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n,
                                  "total_tokens": len(body["prompt"]) + n}
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"


class running:
    """Context manager: serve `fake` with uvicorn on a free localhost port in a daemon thread."""

    def __init__(self, fake: FakeServer) -> None:
        self.fake = fake

    def __enter__(self) -> FakeServer:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.fake.port = sock.getsockname()[1]
        config = uvicorn.Config(self.fake.app(), log_level="critical", access_log=False,
                                timeout_keep_alive=30)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.01)
        self.sock = sock
        return self.fake

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def free_port() -> int:
    """A port nothing listens on (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
