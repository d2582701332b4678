"""Ray across hosts, on one machine: a two-node Ray cluster (`ray.cluster_utils.Cluster`, a head
and one added node, each with its own custom resource and one CPU) that requires Ray's token
authentication (RAY_AUTH_MODE=token), as Ray 2.59+ clusters do by default.

- provision --backend ray --address: simulations on both nodes (their counts per node id), the
  trace and profile shipped (the added node's copies appear in its own TMPDIR), the same answer
  as the local backend;
- serve --backend ray --ray-address: one worker on each node, greedy tokens equal to the engine's
  generate; Ctrl-C then stops it with exit status 130, its workers' sockets closed, no traceback;
- a client without the cluster's token: one error line carrying Ray's own reason;
- a node that runs another splitserve (a third node whose PYTHONPATH holds a fake one): one error
  line naming that node and both versions.
(SIGTERM on a local Ray instance: tests/serve/test_ray.py.)

The cluster lives in a helper process (its own HOME, the token in its environment): this test
process's Ray may already be loaded without token mode, and Ray reads the mode when it loads.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'splitserve[ray]')")

pytestmark = pytest.mark.slow

TOKEN = "0123456789abcdef0123456789abcdef"   # the cluster's token (Ray: at least 32 characters)

HELPER = r"""
import json, sys
from ray.cluster_utils import Cluster
tmp_b, fake = sys.argv[1], sys.argv[2]
c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1},
                                                  "include_dashboard": False})
b = c.add_node(num_cpus=1, resources={"node_b": 1}, env_vars={"TMPDIR": tmp_b})
print(json.dumps({"address": c.address, "head": c.head_node.node_id, "b": b.node_id}), flush=True)
stale = None
for line in sys.stdin:
    if line.strip() == "stale":      # a node whose workers import another splitserve first
        stale = c.add_node(num_cpus=0, env_vars={"PYTHONPATH": fake})
        print(json.dumps({"stale": stale.node_id}), flush=True)
    elif line.strip() == "unstale":
        c.remove_node(stale)
        print(json.dumps({"ok": True}), flush=True)
c.shutdown()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray2")
    home, tmp_b, fake = root / "home", root / "tmp_b", root / "fake"
    for d in (home, tmp_b, fake / "splitserve"):
        d.mkdir(parents=True)
    (fake / "splitserve" / "__init__.py").write_text('__version__ = "9.9.9"\n')
    env = {**os.environ, "HOME": str(home), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-c", HELPER, str(tmp_b), str(fake)], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    info = json.loads(proc.stdout.readline())
    info.update(proc=proc, env=env, tmp_b=tmp_b, root=root)
    yield info
    proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def helper(cluster, command: str) -> dict:
    cluster["proc"].stdin.write(command + "\n")
    cluster["proc"].stdin.flush()
    return json.loads(cluster["proc"].stdout.readline())


def trace_file(path) -> str:
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"{i * 0.25:.2f},{300 + 37 * (i % 11)},{20 + 13 * (i % 7)}" for i in range(80)]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


PROVISION = ["--objective", "cost", "--rps", "6", "--design", "splitwise-hh", "--max-prompt", "3",
             "--max-token", "3", "--no-cache", "--json", "-q"]


def provision(cluster, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "splitserve.cli", "provision", *PROVISION, *args],
                          env=env or cluster["env"], cwd=cluster["root"], capture_output=True, text=True,
                          timeout=180)


def test_provision_runs_on_both_nodes_with_shipped_files_and_agrees_with_local(cluster, tmp_path):
    trace = trace_file(tmp_path / "azure_like.csv")
    profile = tmp_path / "prof.csv"
    # a measured profile of another model and machine: read (and shipped), no rows for this cluster
    profile.write_text("model,hardware,prompt_size,batch_size,token_size,peak_power,average_power,prompt_time,"
                       "token_time,e2e_time,tensor_parallel\nsmall,cpu2-amd-epyc,16,1,16,0.0,0.0,20.0,12.5,207.5,1\n")
    files = ["--workload", trace, "--profile", str(profile)]
    r = provision(cluster, *files, "--backend", "ray", "--address", cluster["address"])
    assert r.returncode == 0, r.stderr
    remote = json.loads(r.stdout)
    nodes = remote["search"]["nodes"]
    # every simulation ran on one of the two nodes, and each node ran some
    assert set(nodes) == {cluster["head"], cluster["b"]} and min(nodes.values()) >= 1
    assert sum(nodes.values()) == remote["search"]["simulated"] and remote["search"]["workers"] == 2
    # the added node read the driver's files from copies the driver shipped: in its own TMPDIR
    shipped = {p.name: p.read_bytes() for p in (cluster["tmp_b"] / "splitserve-shipped").rglob("*.csv")}
    assert shipped == {"azure_like.csv": open(trace, "rb").read(), "prof.csv": profile.read_bytes()}
    local = provision(cluster, *files, "--backend", "local", "--workers", "1")
    assert local.returncode == 0, local.stderr
    here = json.loads(local.stdout)
    assert remote["best"] == here["best"] and remote["search"]["simulated"] == here["search"]["simulated"]
    assert [d["prompt_machines"] for d in remote["designs"]] == [d["prompt_machines"] for d in here["designs"]]


def test_without_the_token_the_error_is_rays_own_in_one_line(cluster, tmp_path):
    env = {k: v for k, v in cluster["env"].items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)                     # no ~/.ray/auth_token either
    env["RAY_gcs_server_port_wait_time_s"] = "2"    # Ray's own retry budget (20 tries by default)
    r = provision(cluster, "--backend", "ray", "--address", cluster["address"], env=env)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: cannot join the Ray cluster at {cluster['address']}: ")
    assert "InvalidAuthToken: Authentication token is missing or incorrect" in lines[0]


def test_a_wrong_address_is_one_line_at_once(cluster):
    port = free_port()                               # nothing listens there
    t0 = time.monotonic()
    r = provision(cluster, "--backend", "ray", "--address", f"127.0.0.1:{port}")
    assert r.returncode == 2 and time.monotonic() - t0 < 30
    assert r.stderr.strip().splitlines() == [
        f"error: cannot reach the Ray cluster at 127.0.0.1:{port}: 127.0.0.1:{port}: Connection refused "
        "(is `ray start --head` running there, on that port?)"]


def test_a_node_with_another_splitserve_is_named(cluster):
    stale = helper(cluster, "stale")["stale"]
    try:
        r = provision(cluster, "--backend", "ray", "--address", cluster["address"])
    finally:
        helper(cluster, "unstale")
    assert r.returncode == 2
    import re

    from splitserve import __version__
    assert re.fullmatch(rf"error: Ray node {stale[:12]} \([0-9.]+\) has splitserve 9\.9\.9, this host has "
                        rf"{re.escape(__version__)}: install the same version on every node", r.stderr.strip()), r.stderr


def serve(args: list[str], env: dict, log_path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "splitserve.cli", "serve", "--model", "tiny", "--port",
                             str(port), "--backend", "ray", *args], env=env, stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def wait_up(proc, url: str, log_path, timeout: float = 150.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, open(log_path).read()
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("server did not come up: " + open(log_path).read())


def refused(addr: str) -> bool:
    host, port = addr.removeprefix("tcp://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        return False
    except OSError:
        return True


def test_serve_places_a_worker_on_each_node_and_answers_like_the_engine(cluster, tmp_path):
    import httpx

    from splitserve.engine.engine import LLMEngine
    from splitserve.engine.sampler import SamplingParams

    log_path = tmp_path / "serve.log"
    proc, url = serve(["--ray-address", cluster["address"], "--prompt-workers", "1", "--token-workers", "1"],
                      cluster["env"], log_path)
    try:
        wait_up(proc, url, log_path)
        prompts, lengths = [[1, 2, 3], list(range(5, 45)), list(range(7, 200))], [8, 12, 6]
        engine = LLMEngine("tiny")
        want = [o.token_ids for o in engine.generate(prompts, [SamplingParams(max_tokens=m) for m in lengths])]
        for prompt, n, expect in zip(prompts, lengths, want):
            r = httpx.post(url + "/v1/completions", timeout=60,
                           json={"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["token_ids"] == expect
        kv = [w["kv_addr"] for w in httpx.get(url + "/debug/state", timeout=10).json()["workers"]]
        placed = [ln for ln in open(log_path).read().splitlines() if " runs on Ray node " in ln]
        on = {ln.split(" runs on Ray node ")[1].split()[0] for ln in placed}
        assert on == {cluster["head"][:12], cluster["b"][:12]}, placed
        proc.send_signal(signal.SIGINT)                # Ctrl-C
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    out = open(log_path).read()
    assert "Traceback" not in out and "router: Ray workers stopped; Ray shut down" in out, out
    assert len(kv) == 2 and all(refused(a) for a in kv)  # the workers' KV sockets are closed



def test_serve_on_cuda_needs_a_gpu_per_worker_in_the_cluster(cluster, tmp_path):
    r = subprocess.run([sys.executable, "-m", "splitserve.cli", "serve", "--model", "tiny", "--port",
                        str(free_port()), "--backend", "ray", "--ray-address", cluster["address"], "--device", "cuda",
                        "--prompt-workers", "1", "--token-workers", "1"],
                       env=cluster["env"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "error: --device cuda: 1 prompt worker x tp 1 + 1 token worker x tp 1 ask Ray for 2 GPUs; the Ray cluster "
        "has 0: give fewer workers, a smaller tp, more nodes or --device cpu")
