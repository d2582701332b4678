"""Overload: a bounded number of requests in flight; the rest get 429 with Retry-After (and 503
with Retry-After when no worker is up), and the server keeps serving. Uses the echo worker mode
(benchmark tool) with a fixed time per token, so the load is known and no model is loaded."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx


def test_bounded_queue_sheds_with_429_then_503(server_factory):
    srv = server_factory("--design", "baseline", "--mixed-workers", "1", "--worker-mode", "echo",
                         "--echo-token-delay", "0.01", "--max-queue", "3", "--no-restart-workers")

    async def burst():
        async with httpx.AsyncClient(timeout=30) as client:
            body = {"prompt": [5, 6, 7], "max_tokens": 30, "temperature": 0}
            return await asyncio.gather(*(client.post(srv.url + "/v1/completions", json=body) for _ in range(20)))

    res = asyncio.run(burst())
    ok = [r for r in res if r.status_code == 200]
    shed = [r for r in res if r.status_code == 429]
    assert len(ok) + len(shed) == 20
    assert 3 <= len(ok) < 20 and shed
    for r in ok:  # echo: token i is (last prompt id + 1 + i) % vocab
        assert r.json()["choices"][0]["token_ids"] == [8 + i for i in range(30)]
    for r in shed:
        assert r.headers["retry-after"] == "1"
        err = r.json()["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "overloaded"
    assert srv.metric("splitserve_rejected_total", status="429") == len(shed)
    # the server keeps serving once the burst is over
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": [1], "max_tokens": 2}, timeout=30)
    assert r.status_code == 200

    # no worker left (and none restarted): 503 with Retry-After, and /health says so
    pid = srv.state()["workers"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while srv.state()["workers"][0]["up"] and time.monotonic() < deadline:
        time.sleep(0.05)
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": [1], "max_tokens": 2}, timeout=30)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "unavailable"
    assert httpx.get(srv.url + "/health").status_code == 503


def test_a_full_server_refuses_before_parsing(server_factory):
    # with the one slot taken, a body that is not even JSON gets the 429 (not the 400 its parse
    # would give): the refusal costs the front end no parsing, tokenizing or checking
    srv = server_factory("--design", "baseline", "--mixed-workers", "1", "--worker-mode", "echo",
                         "--echo-token-delay", "0.05", "--max-queue", "1")

    async def run():
        async with httpx.AsyncClient(timeout=30) as client:
            long = asyncio.ensure_future(client.post(srv.url + "/v1/completions",
                                                     json={"prompt": [5], "max_tokens": 40, "temperature": 0}))
            while not srv.metric("splitserve_requests_in_flight") and not long.done():
                await asyncio.sleep(0.01)
            bad = await client.post(srv.url + "/v1/completions", content=b"{not json",
                                    headers={"Content-Type": "application/json"})
            return bad, await long

    bad, long = asyncio.run(run())
    assert long.status_code == 200
    assert bad.status_code == 429 and bad.json()["error"]["code"] == "overloaded"
    after = httpx.post(srv.url + "/v1/completions", content=b"{not json", timeout=30)
    assert after.status_code == 400                      # with room, the same body is parsed and refused
