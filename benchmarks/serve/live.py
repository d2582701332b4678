"""Helpers shared by the live-server benchmarks of this folder (router_overhead.py, kv_transfer.py,
split_vs_baseline.py): start a real `splitserve serve` (or any HTTP server with GET /health) as a
subprocess, wait until it is ready, stop it and its worker processes whatever happens, read its
Prometheus /metrics, and describe the machine and package versions for the results JSON.

Not a benchmark itself: `python benchmarks/serve/<name>.py --help` for those.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_cmd(*args: str) -> list[str]:
    """`splitserve serve ARGS` as this Python runs it."""
    return [sys.executable, "-m", "splitserve.cli", "serve", *args]


def shell(cmd: list[str]) -> str:
    """`cmd` as one line a person can paste (sys.executable shown as `python`)."""
    return shlex.join(["python" if c == sys.executable else c for c in cmd])


def children(pid: int) -> list[int]:
    """The ids of `pid`'s child processes (Linux /proc; empty elsewhere)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rpartition(")")[2].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # clock ticks per second


def machine_busy() -> int | None:
    """Busy clock ticks of all cores so far (user, nice, system, irq, softirq, steal)."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return f[0] + f[1] + f[2] + f[5] + f[6] + f[7]
    except (OSError, IndexError, ValueError):
        return None


def _tail(log: Path | None, n: int = 40) -> str:
    if log is None:
        return ""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def start(cmd: list[str], port: int, timeout: float = 60.0, log: Path | None = None) -> subprocess.Popen:
    """Start `cmd` in its own session and wait until GET /health on `port` answers 200. Its
    stdout and stderr go to `log` (default: nowhere). Raises RuntimeError, with the log's tail,
    when it exits first or is not up within `timeout` seconds (and then stops it)."""
    out = open(log, "wb") if log is not None else None
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out or subprocess.DEVNULL,
                                start_new_session=True)
    finally:
        if out is not None:
            out.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{shell(cmd)} exited with status {proc.returncode} before it was ready\n"
                               f"{_tail(log)}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    stop(proc)
    raise RuntimeError(f"{shell(cmd)} did not come up within {timeout:g} s\n{_tail(log)}")


def _alive(pid: int) -> bool:
    """`pid` exists, is not a zombie, and is a splitserve worker (so a reused id is left alone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    return state != "Z" and b"splitserve.serve.worker" in cmdline


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server (it stops its workers), SIGKILL it after 10 s; then SIGKILL, by id, any
    of its worker processes (children at the time of the call) that outlived it."""
    workers = children(proc.pid) if proc.poll() is None else []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in workers:
        if _alive(p):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


@contextlib.contextmanager
def running(cmd: list[str], port: int, timeout: float = 60.0, log: Path | None = None):
    """`with running(cmd, port) as proc:` start (as `start`) and always stop (as `stop`)."""
    proc = start(cmd, port, timeout, log)
    try:
        yield proc
    finally:
        stop(proc)


def exit_on_sigterm() -> None:
    """Make SIGTERM raise SystemExit in the main thread, so `finally` blocks (and `running`)
    stop the servers, as they do on Ctrl-C."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, handler)


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*(?:\{[^}]*\})?) (\S+)$")


def scrape(base_url: str) -> dict[str, float]:
    """GET {base_url}/metrics: every sample as 'name{labels}' (as the server writes it) -> value."""
    r = httpx.get(f"{base_url}/metrics", timeout=10)
    r.raise_for_status()
    out = {}
    for line in r.text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = cuda = None
    try:
        import torch

        cuda = torch.version.cuda
        if torch.cuda.is_available():
            gpu = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    mem = None
    try:
        mem = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem, "gpu": gpu, "torch_cuda": cuda,
            "python": platform.python_version(), "platform": platform.platform()}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for p in ("splitserve", "torch", "uvicorn", "fastapi", "starlette", "httptools", "uvloop", "orjson", "pyzmq",
              "httpx"):
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = None
    return out


def header(benchmark: str) -> dict:
    """The start of a results JSON: the benchmark, the command that ran it, machine and versions."""
    return {"benchmark": benchmark, "command": shell([sys.executable, *sys.argv]), "machine": machine(),
            "versions": versions()}


def finish(results: dict, out: Path, name: Callable[[dict], str]) -> int:
    """Write `results` to `out`; print each run that failed (`name(run)` says which) with its error.
    The exit status: 1 when any run failed."""
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out} ({results['wall_s']:.0f} s)")
    errors = [r for r in results["runs"] if "error" in r]
    for r in errors:
        print(f"ERROR in {name(r)}:\n{r['error']}", file=sys.stderr)
    return 1 if errors else 0
