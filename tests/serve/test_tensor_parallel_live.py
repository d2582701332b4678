"""Tensor-parallel worker groups, live on the CPU (gloo): `serve` with a prompt pool at tp a and a
token pool at tp b gives every one of 40 concurrent requests the tokens of one engine at tp 1
(the KV re-sharded on the way), unsplit serving at tp 2 too, and killing one rank of a group under
load loses nothing: the group goes down and is replaced, and its requests are served again."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from .conftest import reference, start_server, stop_server
from .test_lossless import serve_all, workload


def followers(pid: int) -> list[int]:
    """The child processes of `pid` (a worker's tensor-parallel ranks 1..)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def check_tokens(srv, engine, n: int = 40, seed: int = 3) -> None:
    prompts, max_tokens = workload(n, seed)
    want = reference(engine, prompts, max_tokens, ignore_eos=True)
    got = asyncio.run(serve_all(srv.url, prompts, max_tokens, srv.headers))
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not bad, f"{len(bad)} of {n} requests differ, e.g. {bad[0]}: {got[bad[0]]} != {want[bad[0]]}"


@pytest.mark.parametrize("prompt_tp,token_tp,transport,threshold", [
    (1, 2, "tcp", "0"), (2, 1, "tcp", "1000000"), (2, 2, "tcp", "0"), (4, 2, "tcp", "1000000"),
    (2, 2, "nccl", "0"), (2, 1, "nccl", "1000000"),  # the collective transport (gloo here) between groups
])
def test_per_phase_tp_is_lossless(server_factory, reference_engine, prompt_tp, token_tp, transport, threshold):
    srv = server_factory("--prompt-workers", "1", "--token-workers", "1", "--prompt-tp", str(prompt_tp),
                         "--token-tp", str(token_tp), "--transport", transport, "--layerwise-threshold", threshold)
    ranks = {w["home"]: len(followers(w["pid"])) for w in srv.state()["workers"]}
    assert ranks == {"prompt": prompt_tp - 1, "token": token_tp - 1}
    check_tokens(srv, reference_engine)
    st = srv.wait_settled()
    assert all(w["free"] == w["start_free"] and w["reserved"] == 0 for w in st["workers"]), st["workers"]


@pytest.fixture(scope="module")
def unsplit_tp2():
    """One mixed worker at tp 2, for test_unsplit_at_tp_2 and then the idle-rank test (which kills
    a rank: it runs last on it)."""
    srv = start_server("--design", "baseline", "--mixed-workers", "1", "--tp", "2")
    yield srv
    stop_server(srv)


def test_unsplit_at_tp_2(unsplit_tp2, reference_engine):
    srv = unsplit_tp2
    assert [len(followers(w["pid"])) for w in srv.state()["workers"]] == [1]
    check_tokens(srv, reference_engine, n=24, seed=5)


def test_killing_one_rank_under_load_loses_nothing(server_factory, reference_engine):
    srv = server_factory("--prompt-workers", "1", "--token-workers", "1", "--token-tp", "2",
                         "--layerwise-threshold", "0")
    token = next(w for w in srv.state()["workers"] if w["home"] == "token")
    [victim] = followers(token["pid"])
    prompts, max_tokens = workload(40, 17)
    max_tokens = [m + 160 for m in max_tokens]  # long enough to be decoding when the rank dies
    want = reference(reference_engine, prompts, max_tokens, ignore_eos=True)
    decoding = []

    def token_running() -> int:
        return next(w["running"] for w in srv.state()["workers"] if w["id"] == token["id"])

    def kill_when_decoding():  # at once when the token worker reports requests running: a fixed wait
        deadline = time.monotonic() + 30  # after the first was in flight once outlived the whole load in CI
        while (n := token_running()) == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        decoding.append(n)
        os.kill(victim, signal.SIGKILL)

    killer = threading.Thread(target=kill_when_decoding)
    killer.start()
    t0 = time.monotonic()
    got = asyncio.run(serve_all(srv.url, prompts, max_tokens, srv.headers))  # every one 200, or it fails here
    killer.join()
    assert decoding[0] > 0, f"no request reached the token worker in {time.monotonic() - t0:.1f} s"
    assert got == want
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        w = next(w for w in srv.state()["workers"] if w["id"] == token["id"])
        if w["up"] and w["pid"] != token["pid"]:
            break
        time.sleep(0.2)
    assert w["up"] and w["restarts"] >= 1 and w["pid"] != token["pid"]
    assert len(followers(w["pid"])) == 1 and not alive(token["pid"])  # a new group of two; the old one gone


def test_a_rank_that_dies_while_idle_is_noticed(unsplit_tp2, reference_engine):
    """No step runs, yet the worker's heartbeat finds its dead rank: the group is replaced."""
    srv = unsplit_tp2
    srv.wait_settled()  # idle: test_unsplit_at_tp_2's requests are done
    [w0] = srv.state()["workers"]
    [victim] = followers(w0["pid"])
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        [w] = srv.state()["workers"]
        if w["up"] and w["pid"] != w0["pid"]:
            break
        time.sleep(0.2)
    assert w["up"] and w["pid"] != w0["pid"] and len(followers(w["pid"])) == 1
    check_tokens(srv, reference_engine, n=8, seed=9)
