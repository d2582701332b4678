"""`serve --plan` (issue 26, item 5): provision's and simulate's answers read as serve's pools, shrunk
to this host with --scale-to-fit (a line per change), refused in one line otherwise; and a real
provision answer, scaled to fit this machine's CPU, served through HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from splitserve.cli import main
from splitserve.serve.gpus import cpu_cores
from splitserve.serve.plan import Plan, Pool, fit, read_plan

from .test_gpu_assignment import fake_gpus

DATA = Path(__file__).parent / "data"
TINY_TPS = (1, 2, 4)     # the tp the `tiny` preset takes (4 query heads, 2 KV heads, 128 columns)


@pytest.fixture(scope="module")
def provision_json(tmp_path_factory) -> Path:
    """The smallest real provision run: least cost at 5 req/s, 10 s of coding, llama2-70b, two
    designs up to 4 x 4 machines (under a second of simulation)."""
    out = tmp_path_factory.mktemp("provision")
    p = subprocess.run([sys.executable, "-m", "splitserve.cli", "provision", "--objective", "cost", "--rps", "5",
                        "--duration", "10", "--max-prompt", "4", "--max-token", "4", "--max-machines", "8",
                        "-d", "splitwise-hh", "-d", "baseline-h100", "--workers", "1", "--no-cache",
                        "--model", "llama2-70b", "-q", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return out / "provision.json"


def test_every_kind_of_plan_reads_as_pools(provision_json):
    best = json.loads(provision_json.read_text())["best"]
    plan = read_plan(provision_json)     # a DGX-H100 machine is one instance at tp 8
    assert best["design"] == "splitwise-hh" and plan.model == "llama2-70b"
    assert plan.pools == {"prompt": Pool(best["prompt_machines"], 8), "token": Pool(best["token_machines"], 8)}
    cap = read_plan(DATA / "plan_capacity.json")
    assert cap.pools == {"mixed": Pool(1, 2)} and cap.model == "llama3-8b"
    assert cap.policy == {"batching.scheduler": "vllm", "batching.kv_allocation": "on-demand"}  # as searched
    assert cap.max_num_seqs == 64
    place = read_plan(DATA / "plan_placement.json")
    assert place.pools == {"prompt": Pool(1, 4), "token": Pool(1, 1)}
    assert place.policy == {"routing.mixed_pool": False, "batching.kv_allocation": "on-demand"}  # as DistServe ran
    split = read_plan(DATA / "plan_summary_split.json")
    assert split.pools == {"prompt": Pool(3, 4), "token": Pool(2, 2)} and split.gpus == 16
    vllm = read_plan(DATA / "plan_summary_vllm.json")
    assert vllm.pools == {"mixed": Pool(3, 2)} and vllm.system == "vllm" and not vllm.split


def test_fit_keeps_the_prompt_token_ratio():
    ok = lambda tp: tp in (1, 2, 4, 8)
    plan = Plan("t", "m", {"prompt": Pool(15, 1), "token": Pool(5, 1)})
    small, lines = fit(plan, 8, ok, "this host has 8 GPUs")
    assert small.pools == {"prompt": Pool(6, 1), "token": Pool(2, 1)}
    assert lines == ["prompt workers 15 -> 6 (this host has 8 GPUs)", "token workers 5 -> 2 (this host has 8 GPUs)"]
    assert fit(Plan("t", "m", {"prompt": Pool(40, 1), "token": Pool(30, 1)}), 8, ok, "")[0].pools == \
        {"prompt": Pool(4, 1), "token": Pool(3, 1)}
    # the Splitwise paper's setting (DGX machines at tp 8) on one 8-GPU host: one of each at tp 4
    dgx, lines = fit(Plan("t", "m", {"prompt": Pool(2, 8), "token": Pool(1, 8)}), 8, ok, "this host has 8 GPUs")
    assert dgx.pools == {"prompt": Pool(1, 4), "token": Pool(1, 4)} and dgx.gpus == 8
    assert lines == ["prompt tp 8 -> 4 (this host has 8 GPUs)", "token tp 8 -> 4 (this host has 8 GPUs)",
                     "prompt workers 2 -> 1 (this host has 8 GPUs)"]
    # a plan that fits is left alone; an unsplit one keeps as many workers as fit
    assert fit(Plan("t", "m", {"prompt": Pool(2, 2), "token": Pool(1, 4)}), 8, ok, "")[1] == []
    assert fit(Plan("t", "m", {"mixed": Pool(10, 2)}), 8, ok, "")[0].pools == {"mixed": Pool(4, 2)}


def test_fit_to_a_cpu_host_and_to_the_models_heads():
    plan = Plan("t", "llama2-70b", {"prompt": Pool(2, 8, 2), "token": Pool(1, 8)})
    small, lines = fit(plan, 2, lambda tp: tp in TINY_TPS, "2 CPU cores")
    assert small.pools == {"prompt": Pool(1, 1), "token": Pool(1, 1)}
    assert lines == ["prompt pp 2 -> 1 (serve has no pipeline parallelism)",
                     "prompt tp 8 -> 4 (the model's heads cannot take tp 8)",
                     "token tp 8 -> 4 (the model's heads cannot take tp 8)",
                     "prompt tp 4 -> 1 (2 CPU cores)", "token tp 4 -> 1 (2 CPU cores)",
                     "prompt workers 2 -> 1 (2 CPU cores)"]
    # one core, or one GPU: still one worker per pool (at tp 1 they share it)
    assert fit(Plan("t", "m", {"prompt": Pool(3, 2), "token": Pool(1, 2)}), 1, lambda tp: True, "")[0].pools == \
        {"prompt": Pool(1, 1), "token": Pool(1, 1)}


def one_error_line(capsys, code) -> str:
    """The one error line (after any of --plan's notes: the model taken, each change)."""
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in out + err, err
    *notes, line = err.strip().splitlines()
    assert line.startswith("error: ") and all(n.startswith("splitserve serve: --plan: ") for n in notes), err
    return line


@pytest.fixture
def no_server(monkeypatch):
    pytest.importorskip("fastapi")
    import splitserve.serve.server as server
    calls = []
    monkeypatch.setattr(server, "run_server", lambda cfg, **kw: calls.append(cfg))
    return calls


def serve(*argv: str) -> int:
    return main(["serve", "--port", "0", *argv])


def test_plan_errors_are_one_line(tmp_path, capsys, no_server, provision_json, monkeypatch):
    assert "--plan /no/such/plan.json: cannot read it: No such file or directory" in \
        one_error_line(capsys, serve("--plan", "/no/such/plan.json"))
    (tmp_path / "bad.json").write_text("{not json")
    assert "not JSON" in one_error_line(capsys, serve("--plan", str(tmp_path / "bad.json")))
    (tmp_path / "other.json").write_text('{"hello": 1}')
    assert "not a provision.json nor a simulate summary.json" in \
        one_error_line(capsys, serve("--plan", str(tmp_path / "other.json")))
    line = one_error_line(capsys, serve("--plan", str(provision_json), "--device", "cpu"))
    assert "2 prompt workers x tp 8 + 1 token worker x tp 8 need 24 GPUs; --device cpu runs on none" in line
    assert "--scale-to-fit" in line
    fake_gpus(monkeypatch, 1)
    line = one_error_line(capsys, serve("--plan", str(provision_json), "--device", "cuda"))
    assert "need 24 GPUs; this host has 1 GPU: give --scale-to-fit" in line
    fake_gpus(monkeypatch, 32)          # enough GPUs, but tiny's 4 heads cannot be split 8 ways
    line = one_error_line(capsys, serve("--plan", str(provision_json), "--device", "cuda", "--model", "tiny"))
    assert "tiny, prompt pool: tp 8 does not fit this model" in line
    assert "--plan sets the pools" in one_error_line(capsys, serve("--plan", str(provision_json),
                                                                   "--prompt-workers", "3"))
    assert "--scale-to-fit shrinks a --plan" in one_error_line(capsys, serve("--scale-to-fit"))
    pp = json.loads((DATA / "plan_summary_split.json").read_text())
    pp["cluster"]["machines"][0]["hardware"] = "dgx-h100/tp2pp2"
    (tmp_path / "pp.json").write_text(json.dumps(pp))
    assert "its prompt pool runs pipeline parallel 2; serve has none" in \
        one_error_line(capsys, serve("--plan", str(tmp_path / "pp.json"), "--device", "cuda", "--model", "tiny"))
    assert "--scale-to-fit fits a plan to this host" in \
        one_error_line(capsys, serve("--plan", str(provision_json), "--backend", "ray", "--scale-to-fit"))
    assert no_server == []


def test_scaled_to_the_gpus_present(provision_json, capsys, no_server, monkeypatch):
    fake_gpus(monkeypatch, 8)        # the Splitwise paper's 2 x tp 8 + 1 x tp 8 on one 8-GPU host
    assert serve("--plan", str(provision_json), "--device", "cuda", "--scale-to-fit") == 0
    cfg = no_server.pop()
    assert (cfg.model, cfg.prompt_workers, cfg.token_workers, cfg.prompt_tp, cfg.token_tp) == ("llama2-70b", 1, 1, 4, 4)
    assert cfg.gpu_ids == tuple(str(i) for i in range(8))
    err = capsys.readouterr().err
    assert "--plan: prompt tp 8 -> 4 (this host has 8 GPUs)\n" in err and "prompt workers 2 -> 1 (this host has 8 GPUs)" in err


def test_a_plan_sets_the_pools_model_and_policy(capsys, no_server, monkeypatch):
    fake_gpus(monkeypatch, 8)
    assert serve("--plan", str(DATA / "plan_placement.json"), "--device", "cuda") == 0
    cfg = no_server.pop()
    assert (cfg.model, cfg.design, cfg.prompt_workers, cfg.token_workers, cfg.prompt_tp, cfg.token_tp) == \
        ("llama3-8b", "splitwise", 1, 1, 4, 1)
    assert cfg.policy.routing.mixed_pool is False and cfg.gpu_ids == tuple(str(i) for i in range(8))
    err = capsys.readouterr().err
    assert "serving provision.json (goodput-per-gpu: low-affinity): 1 prompt worker x tp 4 + 1 token worker x tp 1" \
        in err and "KV on-demand as the plan was simulated (--kv-allocation reserve to serve otherwise)" in err
    assert cfg.policy.batching.kv_allocation == "on-demand"
    # a command-line policy option and --max-num-seqs win over the plan's
    assert serve("--plan", str(DATA / "plan_capacity.json"), "--device", "cuda", "--max-num-seqs", "8",
                 "--prompt-cap", "512") == 0
    cfg = no_server.pop()
    assert (cfg.design, cfg.mixed_workers, cfg.tp, cfg.max_num_seqs) == ("baseline", 1, 2, 8)
    assert cfg.policy.batching.scheduler == "vllm" and cfg.policy.batching.prompt_token_cap == 512
    assert serve("--plan", str(DATA / "plan_summary_vllm.json"), "--device", "cpu", "--scale-to-fit",
                 "--model", "tiny") == 0
    cfg = no_server.pop()
    assert cfg.policy.system == "vllm" and cfg.design == "baseline" and cfg.model == "tiny"
    assert "model tiny (--model; the plan's is llama2-70b)" in capsys.readouterr().err


def test_a_provision_plan_scaled_to_this_cpu_serves_a_request(provision_json, server_factory, tmp_path):
    from .conftest import reference

    log = tmp_path / "server.log"
    srv = server_factory("--plan", str(provision_json), "--scale-to-fit", "--device", "cpu", log_path=log,
                         timeout=120)
    expect, lines = fit(read_plan(provision_json), cpu_cores(), lambda tp: tp in TINY_TPS,
                        f"{cpu_cores()} CPU cores")
    text = log.read_text()
    for line in lines:
        assert f"splitserve serve: --plan: {line}\n" in text
    st = srv.state()
    assert len(st["workers"]) == sum(p.count for p in expect.pools.values())
    r = httpx.post(srv.url + "/v1/completions", json={"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 8,
                                                      "temperature": 0, "ignore_eos": True}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 8
    from splitserve.engine.engine import LLMEngine
    assert r.json()["choices"][0]["token_ids"] == reference(LLMEngine("tiny"), [[5, 6, 7, 8]], [8], ignore_eos=True)[0]
