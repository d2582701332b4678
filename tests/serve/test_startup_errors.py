"""`serve` refuses what this host cannot give before any worker starts (issue 17, item 6): a busy
port and a CUDA device that is not there are one `error:` line and exit status 2, no traceback."""

from __future__ import annotations

import multiprocessing
import socket

import pytest
import torch

import splitserve.serve.server as server
from splitserve.cli import main
from splitserve.errors import UserError
from splitserve.serve.config import ServeConfig


@pytest.fixture
def no_server(monkeypatch):
    """run_server is where the router starts its workers: any call to it is recorded."""
    calls = []
    monkeypatch.setattr(server, "run_server", lambda cfg, **kw: calls.append(cfg))
    return calls


def one_error_line(capsys, code):
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in out + err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ")
    return line


def test_a_busy_port_is_an_error_before_any_worker(capsys, no_server):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(["serve", "--model", "tiny", "--port", str(port)])
    line = one_error_line(capsys, code)
    assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in line and "another process" in line
    assert no_server == [] and multiprocessing.active_children() == []


def test_a_free_port_reaches_the_server(capsys, no_server):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["serve", "--model", "tiny", "--port", str(port)]) == 0
    assert [c.port for c in no_server] == [port]


def test_port_zero_and_an_unresolvable_host():
    with ServeConfig(port=0).listen() as sock:         # any free port, held
        assert sock.getsockname()[1] > 0
    with pytest.raises(UserError, match="--host no-such-host.invalid: cannot resolve"):
        ServeConfig(host="no-such-host.invalid", port=8000).listen()


def test_the_port_is_held_before_any_worker_starts(monkeypatch):
    """The socket run_server gets is bound already: nothing the workers start can take the port
    (CI once lost a tp-4 server's port to one of its own group's ephemeral ports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    socks = []
    monkeypatch.setattr(server, "run_server", lambda cfg, sock, **kw: socks.append(sock.getsockname()) or _try_bind(port))
    assert main(["serve", "--model", "tiny", "--port", str(port)]) == 0
    assert socks == [("127.0.0.1", port)]


def _try_bind(port):
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a CUDA device")
def test_cuda_without_a_gpu_is_one_line(capsys, no_server):
    line = one_error_line(capsys, main(["serve", "--model", "tiny", "--device", "cuda", "--port", "0"]))
    assert "--device cuda: no CUDA device on this host" in line
    assert no_server == []


def test_a_device_index_past_the_last_gpu(capsys, no_server):
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    line = one_error_line(capsys, main(["serve", "--device", f"cuda:{n}", "--port", "0"]))
    assert (f"this host has {n} CUDA device" in line) if n else ("no CUDA device on this host" in line)
    assert no_server == []


def test_an_unknown_device(capsys, no_server):
    line = one_error_line(capsys, main(["serve", "--device", "gpu", "--port", "0"]))
    assert line == "error: --device must be cpu, cuda, cuda:N or auto, got 'gpu'"


@pytest.mark.parametrize("args, says", [
    (["--device", "cpu"], "--cuda-graphs needs CUDA workers (--device cuda, or auto on a host with a GPU), not --device cpu"),
    (["--device", "cuda", "--worker-mode", "echo"], "not echo workers"),
])
def test_cuda_graphs_on_cpu_or_echo_workers_is_one_line(capsys, no_server, args, says):
    line = one_error_line(capsys, main(["serve", "--cuda-graphs", *args, "--port", "0"]))
    assert says in line and no_server == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a CUDA device")
def test_cuda_graphs_with_auto_on_a_host_without_a_gpu_is_one_line(capsys, no_server):
    line = one_error_line(capsys, main(["serve", "--cuda-graphs", "--device", "auto", "--port", "0"]))
    assert "--device auto runs them on the CPU here" in line and no_server == []


def test_cuda_graphs_reach_every_worker():
    from splitserve.serve.supervisor import WorkerInfo
    from splitserve.serve.worker_args import parse_args, worker_argv

    w = WorkerInfo(id=0, home="token")
    assert parse_args(worker_argv(ServeConfig(device="cuda", cuda_graphs=True), w, "tcp://x:1")).cuda_graphs
    assert not parse_args(worker_argv(ServeConfig(device="cuda"), w, "tcp://x:1")).cuda_graphs


def test_kernels_reach_every_worker_and_triton_needs_cuda_workers(capsys, no_server):
    from splitserve.serve.supervisor import WorkerInfo
    from splitserve.serve.worker_args import parse_args, worker_argv

    w = WorkerInfo(id=0, home="token")
    assert parse_args(worker_argv(ServeConfig(device="cuda", kernels="triton"), w, "tcp://x:1")).kernels == "triton"
    assert parse_args(worker_argv(ServeConfig(), w, "tcp://x:1")).kernels == "torch"   # until run on a GPU
    line = one_error_line(capsys, main(["serve", "--kernels", "triton", "--device", "cpu", "--port", "0"]))
    assert "--kernels triton needs CUDA workers" in line and "not --device cpu" in line
    line = one_error_line(capsys, main(["serve", "--kernels", "fast", "--port", "0"]))
    assert line == "error: --kernels must be auto, torch, triton, got 'fast'" and no_server == []


def test_workers_elsewhere_are_not_checked_here():
    # a Ray cluster's workers may run on hosts with GPUs; echo workers compute nothing
    ServeConfig(device="cuda", backend="ray", ray_address="10.0.0.1:6379").check_device()
    ServeConfig(device="cuda", worker_mode="echo").check_device()
    ServeConfig(device="cpu").check_device()
