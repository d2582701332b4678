"""Seconds from `splitserve serve --model tiny` (1P + 1T on this host's CPU) to its first 200 on
/health: the start every live test and every restart pays.

    python benchmarks/serve/startup.py [--repeats 5] [--label L]   # one JSON line

To time another commit, put its src/ first on PYTHONPATH (the workers inherit it).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_once() -> float:
    port = free_port()
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "splitserve.cli", "serve", "--model", "tiny", "--port", str(port),
                             "--prompt-workers", "1", "--token-workers", "1"], stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"serve exited with {proc.returncode}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    times = []
    for _ in range(a.repeats):
        times.append(start_once())
        time.sleep(0.5)   # the last one's workers gone
    print(json.dumps({"label": a.label, "up_s": [round(t, 3) for t in times],
                      "median_s": round(statistics.median(times), 3)}))


if __name__ == "__main__":
    main()
