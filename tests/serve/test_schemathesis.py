"""Schemathesis (PyPI) fuzzes every operation of `serve`'s own `/openapi.json` (issue 28 item 6):
a Splitwise 1P + 1T `serve --model tiny` with an API key (the session's `split_server`), a
bounded, deterministic run (25 examples an operation, its coverage, fuzzing and stateful phases),
the one check that no response is a 5xx; then the server is healthy: both workers up, and a
completion gives the engine's greedy tokens."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx

from .conftest import API_KEY, complete, reference

SCHEMATHESIS = "schemathesis"  # the test extra's pinned release; its command line runs here


def test_no_generated_request_makes_a_server_error(split_server, reference_engine, tmp_path):
    srv = split_server  # the session's 1P + 1T server with an API key: no server start of its own
    run = subprocess.run([sys.executable, "-m", f"{SCHEMATHESIS}.cli", "run", srv.url + "/openapi.json",
                          "--checks", "not_a_server_error", "--max-examples", "25", "--generation-deterministic",
                          "--header", f"Authorization: Bearer {API_KEY}"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)  # its .schemathesis/ there
    tail = run.stdout[-3000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    assert "Tested: 12" in run.stdout and " passed" in run.stdout and "failed" not in run.stdout.split("SUMMARY")[-1], tail

    health = httpx.get(srv.url + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["workers_up"] == health["workers"] == 2

    async def one():
        async with httpx.AsyncClient(timeout=60) as client:
            return await complete(client, srv.url, [1, 72, 105], 8, False, srv.headers, ignore_eos=True)

    status, toks, body = asyncio.run(one())
    assert status == 200, body
    assert toks == reference(reference_engine, [[1, 72, 105]], [8], ignore_eos=True)[0]
