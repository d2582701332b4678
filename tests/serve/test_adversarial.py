"""Attacks on a live cluster, each followed by the check that normal requests still get correct
tokens and that /health tells the truth: poison sampling parameters, a request that breaks the
engine (quarantine), megabytes of text, a flood of stop strings, large unsigned frames on the
internal sockets, squatted worker identities and a replacement killed while it starts.

One server (1 prompt + 1 token worker of the tiny model) serves the module, in order; the
quarantine has one of its own, whose engine breaks on a chosen token (--debug-fail-token)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import httpx
import pytest
import zmq

from .conftest import complete, reference, start_server, stop_server
from .test_faults import wait_for

POISON = 7  # --debug-fail-token: a step holding a prompt with this token raises in the engine
PROMPT = [1, 40, 41, 42, 43]


@pytest.fixture(scope="module")
def srv():
    s = start_server("--prompt-workers", "1", "--token-workers", "1", "--heartbeat-timeout", "5")
    yield s
    stop_server(s)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def post(srv, body, timeout=30, **kw) -> httpx.Response:
    return httpx.post(srv.url + "/v1/completions", json=body, timeout=timeout, **kw)


def still_serving(srv, engine, restarts: float = 0) -> None:
    """/health says ok, a normal request gets the engine's tokens, nothing leaked, and the
    workers were replaced exactly `restarts` times so far."""
    h = httpx.get(srv.url + "/health", timeout=5)
    assert h.status_code == 200 and h.json()["status"] == "ok", h.text
    want = reference(engine, [PROMPT], [12], ignore_eos=True)[0]
    r = post(srv, {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == want
    st = srv.wait_settled()
    assert all(w["free"] == w["start_free"] and w["reserved"] == 0 for w in st["workers"] if w["up"]), st
    assert srv.metric("splitserve_worker_restarts_total") == restarts


def test_poison_sampling_parameters(srv, reference_engine):
    greedy = reference(reference_engine, [PROMPT], [8], ignore_eos=True)[0]
    for extra in ({"top_k": 2 ** 63}, {"top_k": 2 ** 63 - 1}, {"top_k": -1}, {"temperature": 1e-300},
                  {"temperature": 5e-324, "top_p": 1e-300}, {"logit_bias": {"5": 100, "6": -100}},
                  {"presence_penalty": 2, "frequency_penalty": -2, "repetition_penalty": 1e-9},
                  {"seed": -(2 ** 63)}, {"stop_token_ids": list(range(259))}):
        r = post(srv, {"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True, **extra})
        assert r.status_code in (200, 400), (extra, r.text)
        if "temperature" in extra and r.status_code == 200:
            assert r.json()["choices"][0]["token_ids"] == greedy  # a tiny temperature is greedy
    assert post(srv, {"prompt": PROMPT, "top_k": 2 ** 63, "max_tokens": 2}).status_code == 200
    still_serving(srv, reference_engine)


def test_a_request_that_breaks_the_engine_is_quarantined(server_factory, reference_engine):
    srv = server_factory("--prompt-workers", "1", "--token-workers", "1", "--debug-fail-token", str(POISON))
    innocents = [[1, 30 + i, 31, 32 + i] for i in range(4)]
    want = reference(reference_engine, innocents, [20] * 4, ignore_eos=True)

    async def run():
        async with httpx.AsyncClient(timeout=60) as c:
            jobs = [complete(c, srv.url, [1, 50, POISON, 51], 20, stream=False, ignore_eos=True)]
            jobs += [complete(c, srv.url, p, 20, stream=i % 2 == 0, ignore_eos=True) for i, p in enumerate(innocents)]
            return await asyncio.gather(*jobs)

    (status, _, body), *rest = asyncio.run(run())
    assert status == 500 and body["error"]["code"] == "request_quarantined", body
    assert "cmpl-" in body["error"]["message"] and "debug: a prompt holds token" in body["error"]["message"]
    for (s, toks, _), w in zip(rest, want):
        assert s == 200 and toks == w  # batched with the poison or not: served, token for token
    assert srv.metric("splitserve_requests_total", outcome="quarantined") == 1
    still_serving(srv, reference_engine)  # and no worker died


def test_megabytes_of_text_and_stop_strings_do_not_stall_the_front_end(srv, reference_engine):
    rss0 = rss_mb(srv.proc.pid)
    gaps: list[float] = []
    done = threading.Event()

    def watch():  # /health keeps answering while the big requests are handled
        while not done.is_set():
            t = time.perf_counter()
            assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
            gaps.append(time.perf_counter() - t)
            time.sleep(0.02)

    th = threading.Thread(target=watch)
    th.start()
    try:
        t = time.perf_counter()
        r = post(srv, {"prompt": "x" * (6 << 20), "max_tokens": 4})          # 6 MB of text
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        r = post(srv, {"prompt": PROMPT, "stop": ["ab"] * 200_000})         # 1.2 MB of stop strings
        assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
        r = httpx.post(srv.url + "/v1/completions", content=b"x" * (50 << 20), timeout=30)  # 50 MB
        assert r.status_code == 413
        assert time.perf_counter() - t < 10
    finally:
        done.set()
        th.join()
    assert max(gaps) < 1.0, max(gaps)
    assert rss_mb(srv.proc.pid) - rss0 < 200  # the 50 MB body was never read in
    still_serving(srv, reference_engine)


def test_large_unsigned_frames_are_refused_unread(srv, reference_engine):
    st = srv.state()
    token = st["workers"][1]
    pids = {"router": srv.proc.pid, "token worker": token["pid"]}
    before = {k: rss_mb(p) for k, p in pids.items()}
    ctx = zmq.Context()
    try:
        blob = b"\0" * (256 << 20)
        for addr in (st["router_address"], token["kv_addr"]):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(addr)
            s.send_multipart([b"\0" * 16, blob], copy=False)
        del blob
        time.sleep(1.0)
        t = time.perf_counter()
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
        assert time.perf_counter() - t < 0.5
    finally:
        ctx.destroy(linger=0)
    for k, p in pids.items():
        assert rss_mb(p) - before[k] < 64, (k, before[k], rss_mb(p))  # never buffered
    still_serving(srv, reference_engine)


def test_squatted_identities_and_a_replacement_killed_while_starting(srv, reference_engine):
    st = srv.state()
    ctx = zmq.Context()
    try:
        squatters = []
        for ident in (b"w0.1", b"w0.2", b"w0.3", b"w1.1", b"w1.2", b"router"):  # the identities of old
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, ident)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(st["router_address"])
            s.send(b"hello?")
            squatters.append(s)
        time.sleep(0.2)
        prompt_worker = st["workers"][0]
        os.kill(prompt_worker["pid"], signal.SIGKILL)
        seen_down = wait_for(lambda: (r := httpx.get(srv.url + "/health", timeout=5)).status_code == 503 and r.json())
        assert "prompt pool" in seen_down["reason"], seen_down  # the truth: no live prompt worker
        starting = wait_for(lambda: (w := srv.state()["workers"][0])["state"] == "starting" and w["pid"]
                            and w["pid"] != prompt_worker["pid"] and w)
        os.kill(starting["pid"], signal.SIGKILL)                # the replacement dies before its hello
        wait_for(lambda: srv.state()["workers"][0]["up"], timeout=30)
        w = srv.state()["workers"][0]
        assert w["restarts"] == 2 and w["pid"] not in (prompt_worker["pid"], starting["pid"])
    finally:
        ctx.destroy(linger=0)
    still_serving(srv, reference_engine, restarts=2)
