"""GPUs per worker group (issue 26, item 4): which GPUs each local worker process gets, the one-line
refusal when there are too few, what a worker's command line and environment carry, and what a
Ray actor asks for. Pure functions with numbers; the CUDA count is monkeypatched (no GPU here)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from splitserve.cli import main
from splitserve.errors import UserError
from splitserve.serve import gpus
from splitserve.serve.config import ServeConfig
from splitserve.serve.gpus import assign, describe, groups_of, worker_devices
from splitserve.serve.launcher import LocalLauncher, actor_resources, ray_fit_check
from splitserve.serve.supervisor import WorkerInfo
from splitserve.serve.worker_args import parse_args, worker_argv, worker_cpus

P2T1 = (["prompt", "prompt", "token"], [2, 2, 4])   # 2 prompt workers at tp 2, 1 token worker at tp 4


def test_each_group_gets_consecutive_gpus_of_its_own():
    homes, tps = P2T1
    assert assign(homes, tps, 8) == [(0, 1), (2, 3), (4, 5, 6, 7)]
    assert assign(homes, tps, 16) == [(0, 1), (2, 3), (4, 5, 6, 7)]       # the rest stay free
    assert assign(["prompt", "token"], [1, 1], 2) == [(0,), (1,)]
    assert assign(["mixed"] * 3, [2, 2, 2], 6) == [(0, 1), (2, 3), (4, 5)]


def test_too_few_gpus_is_one_line_naming_both_numbers():
    homes, tps = P2T1
    for present in (0, 1, 7):
        with pytest.raises(UserError) as e:
            assign(homes, tps, present)
        msg = str(e.value)
        assert "\n" not in msg
        assert msg.startswith(f"2 prompt workers x tp 2 + 1 token worker x tp 4 need 8 GPUs; this host has {present}")
    with pytest.raises(UserError, match="1 mixed worker x tp 2 need 2 GPUs; this host has 1"):
        assign(["mixed"], [2], 1)


def test_tp_1_workers_share_gpus_round_robin_when_there_are_fewer():
    # 1 prompt + 1 token worker on one GPU, as serve ran them before worker groups
    assert assign(["prompt", "token"], [1, 1], 1) == [(0,), (0,)]
    assert assign(["prompt"] * 3 + ["token"] * 2, [1] * 5, 2) == [(0,), (1,), (0,), (1,), (0,)]
    # not with --transport nccl: NCCL cannot join two ranks on one GPU
    with pytest.raises(UserError, match="1 prompt worker x tp 1 \\+ 1 token worker x tp 1 need 2 GPUs; this host "
                                        "has 1 \\(--transport nccl"):
        assign(["prompt", "token"], [1, 1], 1, share=False)


def test_describe_counts_each_pool():
    assert describe(groups_of(*P2T1)) == "2 prompt workers x tp 2 + 1 token worker x tp 4"
    assert describe(groups_of(["token", "prompt", "mixed"], [1, 2, 4])) == \
        "1 prompt worker x tp 2 + 1 token worker x tp 1 + 1 mixed worker x tp 4"


def test_worker_devices_visible_set_or_device_index():
    homes, tps = P2T1
    ids = [str(i) for i in range(8)]
    assert [worker_devices(homes, tps, ids, w, False) for w in range(3)] == \
        [("cuda", "0,1"), ("cuda", "2,3"), ("cuda", "4,5,6,7")]
    # this process sees GPUs 3,5,6,7 (its CUDA_VISIBLE_DEVICES): a worker's set names them so
    assert worker_devices(["prompt", "token"], [2, 2], ["3", "5", "6", "7"], 1, False) == ("cuda", "6,7")
    # --transport local: same devices everywhere, a device index each (CUDA IPC handles name it)
    assert [worker_devices(["prompt", "token"], [1, 1], ["0", "1"], w, True) for w in (0, 1)] == \
        [("cuda:0", None), ("cuda:1", None)]
    assert worker_devices(homes, tps, [], 0, False) == (None, None)              # cpu: as before


def test_worker_argv_carries_its_pools_tp_and_gpus():
    cfg = ServeConfig(prompt_workers=2, token_workers=1, prompt_tp=2, token_tp=4, device="cuda",
                      gpu_ids=tuple(str(i) for i in range(8)))
    argvs = [worker_argv(cfg, WorkerInfo(i, h), "tcp://127.0.0.1:1") for i, h in enumerate(cfg.homes())]
    args = [parse_args(a) for a in argvs]
    assert [(a.tp, a.gpus, a.device) for a in args] == [(2, "0,1", "cuda"), (2, "2,3", "cuda"), (4, "4,5,6,7", "cuda")]
    cpu = ServeConfig(tp=2)
    a = parse_args(worker_argv(cpu, WorkerInfo(0, "prompt"), "tcp://127.0.0.1:1"))
    assert (a.tp, a.gpus, a.device) == (2, None, "cpu")
    mixed = ServeConfig(design="baseline", prompt_workers=0, token_workers=0, mixed_workers=2, tp=4)
    assert mixed.worker_tps() == [4, 4]


def test_pinned_cpu_workers_take_the_cores_in_turn():
    # one thread each on 2 cores: 0, 1, then the third shares the first's
    assert [worker_cpus(w, 1, [4, 5]) for w in range(3)] == [[4], [5], [4]]
    # two threads each on 6 cores: consecutive pairs, round the cores
    assert [worker_cpus(w, 2, list(range(6))) for w in range(4)] == [[0, 1], [2, 3], [4, 5], [0, 1]]
    assert worker_cpus(0, 4, [0, 1]) == [0, 1]   # more threads than cores: every core once
    cfg = ServeConfig(prompt_workers=1, token_workers=1, pin_workers=True)
    cpus = sorted(os.sched_getaffinity(0))
    args = [parse_args(worker_argv(cfg, WorkerInfo(i, h), "tcp://127.0.0.1:1")) for i, h in enumerate(cfg.homes())]
    assert [a.cpus for a in args] == [[cpus[0]], [cpus[1 % len(cpus)]]]
    assert parse_args(worker_argv(ServeConfig(), WorkerInfo(0, "prompt"), "tcp://127.0.0.1:1")).cpus is None


def test_local_launcher_gives_each_worker_its_visible_devices(monkeypatch):
    seen = []
    monkeypatch.setattr(subprocess, "Popen", lambda cmd, env, **kw: seen.append(env.get("CUDA_VISIBLE_DEVICES")))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    launcher = LocalLauncher(b"k" * 32)
    launcher.start(0, ["--id", "0", "--gpus", "2,3"])
    launcher.start(1, ["--id", "1"])
    assert seen == ["2,3", None]


def test_ray_actor_asks_for_tp_gpus_of_one_node():
    assert actor_resources("cuda", 8, 4) == {"num_gpus": 4, "num_cpus": 4}
    assert actor_resources("cpu", 8, 2) == {"num_cpus": 2}
    cfg = ServeConfig(prompt_workers=2, token_workers=1, prompt_tp=2, token_tp=4, device="cuda", backend="ray")
    gpus = lambda *per: ({"GPU": sum(per), "CPU": 64}, [{"GPU": g, "CPU": 16} for g in per])
    assert ray_fit_check(cfg, *gpus(8)) is None
    assert ray_fit_check(cfg, *gpus(4, 4, 4, 4)) is None
    assert "2 prompt workers x tp 2 + 1 token worker x tp 4 ask Ray for 8 GPUs; the Ray cluster has 6" in \
        ray_fit_check(cfg, *gpus(6))
    assert "a worker at tp 4 needs 4 GPUs on one node; the Ray cluster's largest node has 2" in \
        ray_fit_check(cfg, *gpus(2, 2, 2, 2))
    # CPU groups at tp > 1 ask tp CPUs of one node; at tp 1, one CPU each, unchecked as before
    cpus = lambda *per: ({"CPU": sum(per)}, [{"CPU": c} for c in per])
    assert "ask Ray for 16 CPUs; the Ray cluster has 2" in ray_fit_check(ServeConfig(tp=8, backend="ray"), *cpus(2))
    assert ray_fit_check(ServeConfig(tp=2, backend="ray"), *cpus(4)) is None
    assert ray_fit_check(ServeConfig(prompt_workers=5, backend="ray"), *cpus(2)) is None


def fake_gpus(monkeypatch, n: int) -> None:
    import torch

    monkeypatch.setattr(gpus, "cpu_only_torch", lambda: False)   # a CUDA build of torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_check_device_shares_out_the_gpus_or_refuses(monkeypatch):
    fake_gpus(monkeypatch, 8)
    cfg = ServeConfig(prompt_workers=2, token_workers=1, prompt_tp=2, token_tp=4, device="cuda")
    cfg.check_device()
    assert cfg.gpu_ids == tuple(str(i) for i in range(8))
    fake_gpus(monkeypatch, 1)
    with pytest.raises(UserError, match="^2 prompt workers x tp 2 \\+ 1 token worker x tp 4 need 8 GPUs; "
                                        "this host has 1"):
        ServeConfig(prompt_workers=2, token_workers=1, prompt_tp=2, token_tp=4, device="cuda").check_device()
    one = ServeConfig(device="cuda")            # 1P + 1T at tp 1 on one GPU: shared, as before
    one.check_device()
    assert one.gpu_ids == ("0",)
    auto = ServeConfig(device="auto", tp=2)
    fake_gpus(monkeypatch, 4)
    auto.check_device()
    assert auto.gpu_ids == ("0", "1", "2", "3")
    cpu = ServeConfig(device="cpu", tp=2)
    cpu.check_device()
    assert cpu.gpu_ids == ()                   # --device cpu: no GPU, as before


def test_the_refusal_is_one_error_line_of_serve(monkeypatch, capsys):
    pytest.importorskip("fastapi")
    fake_gpus(monkeypatch, 1)
    import splitserve.serve.server as server
    monkeypatch.setattr(server, "run_server", lambda cfg, **kw: pytest.fail("a server started"))
    code = main(["serve", "--model", "tiny", "--device", "cuda", "--prompt-workers", "2", "--prompt-tp", "2",
                 "--token-tp", "4", "--port", "0"])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in out + err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: 2 prompt workers x tp 2 + 1 token worker x tp 4 need 8 GPUs; this host has 1")


@pytest.mark.parametrize("argv, says", [
    (["--transport", "local", "--tp", "2"], "--transport local writes KV into one process's cache"),
    (["--transport", "local", "--token-tp", "2"], "use --transport tcp (or nccl)"),
    (["--tp", "3"], "tp 3 does not fit this model"),
    (["--prompt-tp", "8"], "--model tiny, prompt pool: tp 8 does not fit"),
    (["--tp", "0"], "--tp, --prompt-tp and --token-tp must be at least 1"),
    (["--design", "baseline", "--prompt-tp", "2"], "--design baseline runs one mixed pool: give --tp"),
    (["--device", "cuda:0", "--tp", "2"], "--device cuda:0 puts every worker on one GPU"),
])
def test_refusals_are_one_line(argv, says, capsys, monkeypatch):
    pytest.importorskip("fastapi")
    import splitserve.serve.server as server
    monkeypatch.setattr(server, "run_server", lambda cfg, **kw: pytest.fail("a server started"))
    code = main(["serve", "--model", "tiny", "--port", "0", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in out + err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ") and says in line, line


def test_echo_workers_ignore_tp(monkeypatch):
    calls = []
    import splitserve.serve.server as server
    pytest.importorskip("fastapi")
    monkeypatch.setattr(server, "run_server", lambda cfg, **kw: calls.append(cfg))
    assert main(["serve", "--model", "tiny", "--port", "0", "--worker-mode", "echo", "--tp", "3"]) == 0
    assert calls[0].worker_tps() == [3, 3] and calls[0].gpu_ids == ()


def test_gpus_present_follows_cuda_visible_devices(monkeypatch):
    fake_gpus(monkeypatch, 3)
    assert gpus.gpus_present() == ["0", "1", "2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6,7")
    assert gpus.gpus_present() == ["5", "6", "7"]


def test_a_cpu_build_of_torch_has_no_gpus_without_importing_torch(monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.13.0+cpu")
    assert gpus.cpu_only_torch() and gpus.gpus_present() == []
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.13.0+cu128")
    assert not gpus.cpu_only_torch()
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.13.0")   # PyPI's CUDA wheel
    assert not gpus.cpu_only_torch()


def test_serve_on_the_cpu_does_not_import_torch():
    code = ("import sys; from splitserve.serve.config import ServeConfig; "
            "ServeConfig(device='cpu').check_device(); ServeConfig(device='auto').check_device(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ("False" if gpus.cpu_only_torch() else "True")
