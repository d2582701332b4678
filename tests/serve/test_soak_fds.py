"""The front end holds no more file descriptors after a soak than before it (issue 45 saw 23 -> 28
after 60 s at 10 req/s): ten seconds of completions, streamed chat, streams the client leaves
midway, tool calls, Responses and /metrics scrapes, on new connections and on a kept-alive one
(closed before the count). Linux only: it reads /proc/PID/fd."""

from __future__ import annotations

import os
import sys
import time

import httpx
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/fd (Linux only)")

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                     "properties": {"a": {"type": "boolean"}}}}}


def one(srv, keep: httpx.Client, n: int) -> None:
    """Request kind n % 4."""
    body = {"model": "tiny", "prompt": [1, 5, 6], "max_tokens": 8}
    if n % 4 == 0:
        httpx.post(srv.url + "/v1/completions", json=body, headers=srv.headers, timeout=30)
    elif n % 4 == 1:
        with httpx.stream("POST", srv.url + "/v1/completions", json={**body, "max_tokens": 200, "stream": True},
                          headers=srv.headers, timeout=30) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i > 3:
                    break                              # the client leaves mid-stream
    elif n % 4 == 2:
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=chat, headers=srv.headers, timeout=30) as r:
            for _ in r.iter_lines():
                pass
    else:
        keep.post(srv.url + "/v1/chat/completions", headers=srv.headers, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "tools": [TOOL],
            "tool_choice": "required"})
        keep.post(srv.url + "/v1/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 4},
                  headers=srv.headers)
        keep.get(srv.url + "/metrics")


def test_a_soak_leaves_no_file_descriptor_open(server_factory):
    srv = server_factory("--prompt-workers", "1", "--token-workers", "1")
    fds = lambda: len(os.listdir(f"/proc/{srv.proc.pid}/fd"))  # noqa: E731
    with httpx.Client(timeout=30) as warm:
        one(srv, warm, 0)
    time.sleep(1.0)
    before = fds()
    with httpx.Client(timeout=30) as keep:
        end, n = time.monotonic() + 10.0, 0
        while time.monotonic() < end:
            one(srv, keep, n)
            n += 1
    deadline = time.monotonic() + 10.0
    while fds() > before and time.monotonic() < deadline:   # connections the server has yet to see closed
        time.sleep(0.2)
    assert n >= 40 and fds() <= before, (n, before, fds())
