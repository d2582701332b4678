"""What an unlucky operator or a careless client does to a live cluster: pauses of the router, an
API key guessed with huge bodies, clients that leave, SIGTERM with streams open, requests that can
never fit, sampling fields, and `--transport local` with both transfer modes in turn."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time

import httpx
import pytest

from .conftest import API_KEY, complete, reference, start_server, stop_server
from .test_faults import wait_for


def post(srv, body, headers=None, timeout=30) -> httpx.Response:
    return httpx.post(srv.url + "/v1/completions", json=body, headers=headers or srv.headers, timeout=timeout)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """A 1P + 1T server with a 2 s heartbeat timeout whose API key comes from a file, shared in
    turn by the router-pause test, the key-file test and, last (it stops the server), the
    SIGTERM test: one server start instead of three."""
    keyfile = tmp_path_factory.mktemp("key") / "key"
    keyfile.write_text("file-key-42\n")
    srv = start_server("--heartbeat-timeout", "2", "--api-key-file", str(keyfile), api_key="file-key-42",
                       key_arg=False)
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def echo_server():
    """Echo workers, one token per 50 ms step: the leaving-client test, then the SIGTERM drain
    test with the default drain (which stops it)."""
    srv = start_server("--worker-mode", "echo", "--echo-token-delay", "0.05")
    yield srv
    stop_server(srv)


def test_a_router_pause_longer_than_the_heartbeat_timeout_ends_no_worker(keyed, reference_engine):
    # the router's loop stops for 3 s (SIGSTOP: a GC pause, a swapped-out host) with a 2 s heartbeat
    # timeout: on waking it reads the heartbeats queued meanwhile before it judges anyone silent,
    # and the workers wait twice the timeout (4 s) for the router
    srv = keyed
    pids = {w["pid"] for w in srv.state()["workers"]}
    os.kill(srv.proc.pid, signal.SIGSTOP)
    time.sleep(3)
    os.kill(srv.proc.pid, signal.SIGCONT)
    time.sleep(1)
    st = srv.state()
    assert {w["pid"] for w in st["workers"]} == pids and all(w["up"] and w["restarts"] == 0 for w in st["workers"])
    want = reference(reference_engine, [[1, 2, 3]], [5], ignore_eos=True)[0]
    r = post(srv, {"prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0, "ignore_eos": True})
    assert r.json()["choices"][0]["token_ids"] == want


def _raw_post(url: str, head: str, body: bytes) -> tuple[int, float]:
    """POST with a hand-written head; (status, seconds to the answer). The body is sent only after
    the answer did not come within 1 s."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        t = time.perf_counter()
        s.sendall(head.encode())
        s.settimeout(1.0)
        try:
            answer = s.recv(4096)
        except socket.timeout:
            s.settimeout(30)
            s.sendall(body)
            answer = s.recv(4096)
        return int(answer.split()[1]), time.perf_counter() - t


def test_the_api_key_and_the_body_size_are_checked_before_the_body_is_read(split_server):
    big = 300 << 20
    for headers, want in ((f"Content-Length: {big}\r\n", 401),                                   # no key
                          (f"Authorization: Bearer {API_KEY}\r\nContent-Length: {big}\r\n", 413)):  # too big
        head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}\r\n"
        status, took = _raw_post(split_server.url, head, b"")
        assert status == want and took < 0.9  # answered before a byte of the body was sent
    # a chunked body (no announced length) is cut at the limit
    r = httpx.post(split_server.url + "/v1/completions", headers=split_server.headers, timeout=30,
                   content=(b"x" * (1 << 20) for _ in range(20)))
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_api_key_from_a_file_and_not_on_the_command_line(keyed):
    srv = keyed  # started with --api-key-file holding "file-key-42"
    with open(f"/proc/{srv.proc.pid}/cmdline", "rb") as f:
        assert b"file-key-42" not in f.read()
    body = {"prompt": [1, 2], "max_tokens": 2}
    assert post(srv, body, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert post(srv, body, headers={"Authorization": "Bearer file-key-42"}).status_code == 200


def test_a_client_that_leaves_cancels_its_non_streaming_request(echo_server):
    # echo workers, one token per 50 ms step: a 100-token request takes 5 s; its client leaves at 0.3 s
    srv = echo_server

    async def leave():
        async with httpx.AsyncClient(timeout=0.3) as c:
            jobs = [c.post(srv.url + "/v1/completions", json={"prompt": [1, 2, 3 + i], "max_tokens": 100})
                    for i in range(8)]
            for r in await asyncio.gather(*jobs, return_exceptions=True):
                assert isinstance(r, httpx.TimeoutException)

    asyncio.run(leave())
    wait_for(lambda: srv.metric("splitserve_requests_total", outcome="cancelled") == 8, timeout=3)
    assert srv.metric("splitserve_requests_total", outcome="completed") == 0
    st = srv.wait_settled(timeout=3)
    assert st["in_flight"] == 0 and st["policy_idle"]


@pytest.mark.parametrize("drain", [0.5, None])
def test_sigterm_drains_streams_or_ends_them_with_an_error_and_done(server_factory, request, drain):
    # echo workers, one token per 50 ms step: 100 tokens take 5 s, longer than uvicorn's own grace;
    # the default drain (20 s) lets them finish, a 0.5 s one cuts them
    if drain:
        srv = server_factory("--worker-mode", "echo", "--echo-token-delay", "0.05", "--drain-timeout", str(drain))
    else:  # the module's echo server (default drain), idle again after the leaving-client test
        srv = request.getfixturevalue("echo_server")
        srv.wait_settled()
    lines: list[list[str]] = [[] for _ in range(3)]

    async def run():
        async with httpx.AsyncClient(timeout=60) as c:
            async def one(i):
                body = {"prompt": [1, 2, 3 + i], "max_tokens": 100, "stream": True}
                async with c.stream("POST", srv.url + "/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            lines[i].append(line[6:])
            tasks = [asyncio.create_task(one(i)) for i in range(3)]
            await asyncio.sleep(0.8)
            srv.proc.send_signal(signal.SIGTERM)
            await asyncio.gather(*tasks)

    asyncio.run(run())
    srv.proc.wait(timeout=30)
    for ev in lines:
        assert ev[-1] == "[DONE]", ev[-3:]
        chunks = [json.loads(e) for e in ev[:-1]]
        if drain is None:   # time enough: every stream finished
            assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 100
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        else:            # cut: the last event says why
            assert "shutting down" in chunks[-1]["error"]["message"]


def test_a_request_that_can_never_fit_is_refused_at_once(server_factory):
    # 8 blocks of 16 tokens per worker: 128 tokens of KV; the model's context is 512
    srv = server_factory("--num-blocks", "8")
    assert httpx.get(srv.url + "/v1/models").json()["data"][0]["max_model_len"] == 128
    t = time.perf_counter()
    r = post(srv, {"prompt": [5] * 100, "max_tokens": 50})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert time.perf_counter() - t < 2
    assert post(srv, {"prompt": [5] * 100, "max_tokens": 28}).status_code == 200


def test_penalties_and_logit_bias_change_the_output(split_server, reference_engine):
    base = {"prompt": [1, 40, 41, 42], "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    plain = post(split_server, base).json()["choices"][0]["token_ids"]
    forced = post(split_server, {**base, "logit_bias": {"99": 100}}).json()["choices"][0]["token_ids"]
    assert forced == [99] * 12
    for field, value in (("presence_penalty", 2.0), ("frequency_penalty", 2.0), ("repetition_penalty", 1.9)):
        r = post(split_server, {**base, field: value})
        assert r.status_code == 200
        toks = r.json()["choices"][0]["token_ids"]
        assert toks != plain, field
        from splitserve.engine.sampler import SamplingParams  # the engine alone agrees
        ref = reference_engine.generate([base["prompt"]], SamplingParams(max_tokens=12, ignore_eos=True,
                                                                         **{field: value}))[0].token_ids
        assert toks == ref, field
    r = post(split_server, {**base, "echo": True, "prompt": "Hi"})
    assert r.json()["choices"][0]["text"].startswith("Hi")


def test_malformed_text_and_nesting_get_400(split_server):
    for raw in (b'{"prompt": "a\\ud800", "max_tokens": 2}', b'{"a":' * 50_000 + b"1" + b"}" * 50_000):
        r = httpx.post(split_server.url + "/v1/completions", content=raw, timeout=30,
                       headers={**split_server.headers, "Content-Type": "application/json"})
        assert r.status_code == 400, r.text


def test_local_transport_serialized_after_layerwise(server_factory, reference_engine):
    srv = server_factory("--transport", "local", "--layerwise-threshold", "20")
    prompts = [[(3 * i) % 250 + 3 for i in range(40)], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]  # layer-wise, then not
    want = reference(reference_engine, prompts, [6, 6], ignore_eos=True)

    async def go(p):
        async with httpx.AsyncClient(timeout=60) as c:
            return await complete(c, srv.url, p, 6, stream=False, ignore_eos=True)

    for p, w in zip(prompts, want):
        status, toks, body = asyncio.run(go(p))
        assert status == 200 and toks == w, body
    assert srv.metric("splitserve_worker_restarts_total") == 0
    assert srv.metric("splitserve_kv_transfers_total", mode="layerwise") == 1
    assert srv.metric("splitserve_kv_transfers_total", mode="serialized") == 1


def _running(pid: int) -> bool:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def test_sigterm_stops_the_server_and_its_workers(keyed):
    srv = keyed  # a 1P + 1T server; this test, its last, stops it
    pids = [w["pid"] for w in srv.state()["workers"]]
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=15) is not None
    wait_for(lambda: not any(_running(p) for p in pids), timeout=10)


@pytest.mark.parametrize("at_start", [signal.SIG_DFL, signal.SIG_IGN], ids=["sigint-default", "sigint-ignored"])
def test_ctrl_c_ends_with_130_however_the_server_was_started(server_factory, at_start):
    # SIG_IGN: how `nohup splitserve serve &` or a non-interactive shell's background job starts it
    # (the child inherits the ignored SIGINT; uvicorn still stops on it, then re-raised it into the
    # ignore and the server exited 0)
    before = signal.signal(signal.SIGINT, at_start)
    try:
        srv = server_factory()
    finally:
        signal.signal(signal.SIGINT, before)
    pids = [w["pid"] for w in srv.state()["workers"]]
    srv.proc.send_signal(signal.SIGINT)
    assert srv.proc.wait(timeout=15) == 130
    wait_for(lambda: not any(_running(p) for p in pids), timeout=10)
