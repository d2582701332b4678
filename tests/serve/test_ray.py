"""`--backend ray` on a local Ray instance: workers as Ray actors give the same tokens, and SIGTERM
stops the server with no traceback (Ray's own SIGTERM handler, which would call sys.exit inside
the event loop, and its C++ one, which aborts, are replaced by the one that was there: the server
drains, stops its actors and Ray, and is killed by the SIGTERM uvicorn re-raises, as with the
local backend). The two-node cluster's tests are in tests/test_ray_two_nodes.py."""

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from .conftest import free_port, reference

pytest.importorskip("ray", reason="Ray is not installed (pip install 'splitserve[ray]')")


def test_ray_backend_serves_the_same_tokens_and_stops_on_sigterm(reference_engine, tmp_path):
    port, log_path = free_port(), tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "splitserve.cli", "serve", "--model", "tiny", "--port",
                                 str(port), "--backend", "ray", "--prompt-workers", "1", "--token-workers", "1"],
                                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log_path.read_text()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not come up: " + log_path.read_text()
            time.sleep(0.2)
        prompts = [[1, 2, 3], list(range(5, 45)), list(range(7, 200))]
        want = reference(reference_engine, prompts, [8, 12, 6])
        for prompt, max_tokens, expect in zip(prompts, [8, 12, 6], want):
            r = httpx.post(url + "/v1/completions", timeout=60,
                           json={"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["token_ids"] == expect
        deadline = time.monotonic() + 10       # no leaked blocks: every worker's free KV back at its start
        while True:
            st = httpx.get(url + "/debug/state", timeout=10).json()
            settled = st["in_flight"] == 0 and all(w["free"] == w["start_free"] for w in st["workers"] if w["up"])
            if settled or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert settled, st
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = log_path.read_text()
    assert rc == -signal.SIGTERM, out          # killed by the SIGTERM uvicorn re-raises once drained
    assert "Traceback" not in out and "SIGTERM received" not in out, out
    assert out.count("runs on Ray node") == 2 and "router: Ray workers stopped; Ray shut down" in out, out
