"""A real `splitserve serve` subprocess (with real worker processes) on a free port, and helpers.

Every server is stopped at the end of its fixture: SIGTERM (the router stops its workers), then
SIGKILL of the server and of every worker pid it reported, whatever state the test left."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("zmq")
pytest.importorskip("torch")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    api_key: str | None = None
    worker_pids: set = field(default_factory=set)

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def state(self) -> dict:
        st = httpx.get(self.url + "/debug/state", headers=self.headers, timeout=10).json()
        self.worker_pids |= {w["pid"] for w in st["workers"] if w["pid"]}
        return st

    def metric(self, name: str, **labels) -> float:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            key, _, val = line.rpartition(" ")
            n, _, lab = key.partition("{")
            if n == name and all(f'{k}="{v}"' in lab for k, v in labels.items()):
                total += float(val)
        return total

    def wait_settled(self, timeout: float = 10.0) -> dict:
        """Until every live worker's free KV blocks are back at their starting count, nothing is
        reserved, and the policy's counters are at zero. Returns the last state."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.state()
            live = [w for w in st["workers"] if w["up"]]
            ok = (st["in_flight"] == 0 and st["policy_idle"]
                  and all(w["free"] == w["start_free"] and w["reserved"] == 0 for w in live))
            if ok or time.monotonic() > deadline:
                return st
            time.sleep(0.1)


def _die_with_parent() -> None:
    """Linux: the server gets SIGTERM if the test process dies without cleaning up."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # no such libc, or no prctl in it: not Linux
        pass


def start_server(*args: str, api_key: str | None = None, timeout: float = 60.0, key_arg: bool = True,
                 log_path=None) -> Server:
    """key_arg False: `api_key` is what the server expects, given to it in `args` some other way.
    log_path: the server's stderr (its log) goes to this file."""
    port = free_port()
    cmd = [sys.executable, "-m", "splitserve.cli", "serve", "--model", "tiny", "--port", str(port), *args]
    if api_key and key_arg:
        cmd += ["--api-key", api_key]
    log = open(log_path, "wb") if log_path is not None else None
    with log if log is not None else contextlib.nullcontext():
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=log, start_new_session=True,
                                preexec_fn=_die_with_parent)
    srv = Server(proc, f"http://127.0.0.1:{port}", api_key)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}"
                               + (f": {open(log_path).read()}" if log_path is not None else ""))
        try:
            if httpx.get(srv.url + "/health", timeout=1).status_code == 200:
                srv.state()
                return srv
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop_server(srv)
            raise RuntimeError("server did not come up")
        time.sleep(0.1)


def stop_server(srv: Server) -> None:
    try:
        srv.state()
    except (httpx.HTTPError, ValueError, KeyError, TypeError):  # down, or no state to read: the pids it reported
        pass
    if srv.proc.poll() is None:
        srv.proc.send_signal(signal.SIGTERM)
        try:
            srv.proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
            srv.proc.wait()
    for pid in srv.worker_pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture
def server_factory():
    started: list[Server] = []

    def make(*args, **kw) -> Server:
        srv = start_server(*args, **kw)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        stop_server(srv)


API_KEY = "test-key-123"

# The shared servers live as long as tests/serve runs (scope "package", not "session"): stopped when
# its last test is done, their idle routers and workers take no CPU from the tests after it (the
# simulator, the twin's timed live run, the GPU check's CPU run).


@pytest.fixture(scope="package")
def split_server():
    """1 prompt + 1 token worker, KV always layer by layer, an API key."""
    srv = start_server("--prompt-workers", "1", "--token-workers", "1", "--layerwise-threshold", "0",
                       api_key=API_KEY)
    yield srv
    stop_server(srv)


@pytest.fixture(scope="package")
def split_2x2_server():
    """2 prompt + 2 token workers, KV always in one shot (serialized)."""
    srv = start_server("--prompt-workers", "2", "--token-workers", "2", "--layerwise-threshold", "1000000")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="package")
def single_server():
    """Unsplit: one mixed worker serves every request whole."""
    srv = start_server("--design", "baseline", "--mixed-workers", "1")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def reference_engine():
    from splitserve.engine.engine import LLMEngine
    return LLMEngine("tiny")


# Greedy tokens are compared token for token; where the two best logits of a step are closer than
# this, the float sums of another batch shape may pick the other one (one at 7e-7 did, 2026-12-07).
NEAR_TIE = 1e-4


def reference(engine, prompts: list[list[int]], max_tokens: list[int], ignore_eos: bool = False) -> list[list[int]]:
    """LLMEngine.generate's greedy tokens for the prompts, after checking that no step of them is a
    near tie (a workload with one is a workload to change, not a serving error)."""
    from splitserve.engine.sampler import SamplingParams
    outs = engine.generate(prompts, [SamplingParams(max_tokens=m, ignore_eos=ignore_eos, return_logits=True)
                                     for m in max_tokens])
    for i, o in enumerate(outs):
        for k, row in enumerate(o.logits):
            top = row.float().topk(2).values
            assert top[0] - top[1] >= NEAR_TIE, (
                f"prompt {i}, output {k}: its two best tokens are {float(top[0] - top[1]):.1e} apart; greedy "
                f"equality there rests on float summation order: change the workload's seed")
    return [o.token_ids for o in outs]


async def complete(client: httpx.AsyncClient, url: str, prompt, max_tokens: int, stream: bool,
                   headers: dict | None = None, **extra) -> tuple[int, list[int], dict]:
    """(status, token ids, final body or last chunk); streams are reassembled from SSE."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            **extra}
    if not stream:
        r = await client.post(url + "/v1/completions", json=body, headers=headers or {})
        js = r.json()
        toks = js["choices"][0]["token_ids"] if r.status_code == 200 else []
        return r.status_code, toks, js
    import json
    toks: list[int] = []
    last: dict = {}
    async with client.stream("POST", url + "/v1/completions", json=body, headers=headers or {}) as r:
        if r.status_code != 200:
            return r.status_code, [], json.loads(await r.aread())
        done = False
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                done = True
                break
            last = json.loads(payload)
            if "error" in last:
                return 500, toks, last
            for c in last.get("choices", []):
                toks += c["token_ids"]
        assert done, "stream ended without data: [DONE]"
    return 200, toks, last
