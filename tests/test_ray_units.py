"""The pure parts of Ray across hosts (nodes/ray_cluster.py, serve/launcher.py, serve/worker_args.py):
addresses, Ray's reason out of ray.init's exception, the resources an actor asks for, the host a
remote worker binds. No Ray needed (tests/test_ray_two_nodes.py runs them on a cluster)."""

from __future__ import annotations

import pytest

from splitserve.errors import UserError
from splitserve.nodes.ray_cluster import host_port, is_local, local_ip, ray_reason


def test_addresses():
    assert host_port("10.0.0.7:6379") == ("10.0.0.7", 6379)
    assert host_port("ray://head.example:10001") == ("head.example", 10001)
    assert host_port("[::1]:6379") == ("::1", 6379)
    for bad in ("head", "head:", ":6379", "head:port"):
        with pytest.raises(UserError, match="give HOST:PORT"):
            host_port(bad)
    assert [is_local(a) for a in (None, "", "local", "10.0.0.7:6379")] == [True, True, True, False]
    assert local_ip(None) == "127.0.0.1"


def test_rays_reason_is_the_last_line_of_the_wrapped_cause():
    # ray.init's shape (ray/_private/worker.py): ConnectionError from a RuntimeError whose text ends
    # with the GCS client's traceback, whose last line is Ray's exception and message
    cause = RuntimeError("Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
                         '  File "python/ray/includes/common.pxi", line 119, in ray._raylet.check_status\n'
                         "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication "
                         "token is missing or incorrect.  Ensure that\n")
    try:
        try:
            raise cause
        except RuntimeError as e:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.7:6379") from e
    except ConnectionError as wrapped:
        got = ray_reason(wrapped)
    assert got == ("ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication token is "
                   "missing or incorrect. Ensure that")
    assert ray_reason(RuntimeError("Version mismatch: The cluster was started with:\n    Ray: 2.60.0")) == \
        "Version mismatch: The cluster was started with: Ray: 2.60.0"


def test_actor_resources_one_gpu_per_cuda_worker():
    pytest.importorskip("zmq")
    from splitserve.serve.launcher import actor_resources

    assert actor_resources("cuda", 0) == {"num_gpus": 1, "num_cpus": 1}
    assert actor_resources("cuda", 8) == {"num_gpus": 1, "num_cpus": 1}
    assert actor_resources("auto", 2) == {"num_gpus": 1, "num_cpus": 1}
    assert actor_resources("auto", 0) == {"num_cpus": 1}
    assert actor_resources("cpu", 8) == {"num_cpus": 1}


def test_a_remote_worker_binds_its_node_ip_and_cuda_n_is_refused_under_ray():
    from splitserve.serve.config import ServeConfig
    from splitserve.serve.worker_args import parse_args, set_host, worker_argv
    from splitserve.serve.supervisor import WorkerInfo

    argv = worker_argv(ServeConfig(backend="ray", worker_host="10.0.0.1"), WorkerInfo(0, "prompt"),
                       "tcp://10.0.0.1:5555")
    moved = set_host(argv, "10.0.0.9")
    assert parse_args(argv).host == "10.0.0.1" and parse_args(moved).host == "10.0.0.9"
    assert len(moved) == len(argv) and [a for a in moved if a != "10.0.0.9"] == [a for a in argv if a != "10.0.0.1"]
    with pytest.raises(UserError) as e:
        ServeConfig(backend="ray", device="cuda:1").validate()
    assert str(e.value) == ("--device cuda:1: with --backend ray, Ray gives each worker its own GPU "
                            "(CUDA_VISIBLE_DEVICES); use --device cuda")
    ServeConfig(backend="local", device="cuda:1").validate()   # a local worker may name its device
