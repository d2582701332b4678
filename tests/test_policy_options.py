"""`simulate` and `serve` take the same policy options (names, defaults, help), both made from the
one PolicyConfig (policy/config.py), and serve hands each worker that same config."""

from __future__ import annotations

import dataclasses

import pytest
import typer.main

from splitserve.cli import app
from splitserve.errors import UserError
from splitserve.policy.config import OPTIONS, PolicyConfig, make_policy
from splitserve.policy.machine import BatchingConfig


def options(name: str) -> dict[str, tuple]:
    cmd = typer.main.get_command(app).commands[name]
    return {opt: (p.default, p.help) for p in cmd.params for opt in p.opts}


def test_serve_accepts_every_policy_option_of_simulate_with_the_same_default():
    sim, srv = options("simulate"), options("serve")
    policy = {f"--{o.name}" for o in OPTIONS}
    assert len(policy) == 25 and policy <= set(sim) and policy <= set(srv)
    for name in policy - {"--kv-allocation"}:
        assert sim[name] == srv[name], name
    # the one exception, said in both helps: the live system allocates on demand (SERVING)
    assert sim["--kv-allocation"][1].endswith("(default: reserve)")
    assert srv["--kv-allocation"][1].endswith("(default: on-demand)")
    assert sim["--kv-allocation"][1].rsplit("(", 1)[0] == srv["--kv-allocation"][1].rsplit("(", 1)[0]
    # and nothing else of simulate sets a policy: every field of PolicyConfig has its option
    fields = {f"{s.name}.{f.name}" for s in dataclasses.fields(PolicyConfig) if dataclasses.is_dataclass(s.default)
              for f in dataclasses.fields(s.default)} | {"layerwise_threshold"}
    assert fields - {o.path for o in OPTIONS} == {"batching.max_seqs"}  # serve's --max-num-seqs (engine)


def test_defaults_are_written_once_in_the_dataclasses():
    cfg = make_policy({o.path: o.default() for o in OPTIONS})
    assert cfg == PolicyConfig()
    assert make_policy({"batching.chunk_size": 512}).batching == BatchingConfig(chunk_size=512)
    with pytest.raises(UserError, match="--prompt-cap"):
        make_policy({"batching.prompt_token_cap": 0})
    with pytest.raises(TypeError):  # keyword-only: no positional slip
        BatchingConfig(2048)


def test_the_config_reaches_the_workers_whole():
    from splitserve.serve.config import ServeConfig
    from splitserve.serve.supervisor import WorkerInfo
    from splitserve.serve.worker_args import parse_args, worker_argv

    policy = make_policy({"batching.chunk_size": 64, "batching.preemption_limit": 1,
                          "routing.prompt_queue_threshold": 100, "routing.mixed_pool": False,
                          "layerwise_threshold": 7})
    argv = worker_argv(ServeConfig(policy=policy, max_num_seqs=12), WorkerInfo(0, "prompt"), "tcp://127.0.0.1:1")
    got = parse_args(argv).policy  # as the worker reads it
    assert got == dataclasses.replace(policy, batching=dataclasses.replace(policy.batching, max_seqs=12))


def test_serve_refuses_the_simulated_only_pull():
    import pytest

    from splitserve.errors import UserError
    from splitserve.policy.cluster import RoutingConfig
    from splitserve.policy.config import PolicyConfig
    from splitserve.serve.config import ServeConfig

    cfg = ServeConfig(policy=PolicyConfig(routing=RoutingConfig(kv_pull=True, mixed_pool=False)))
    with pytest.raises(UserError, match="--kv-pull is simulated only"):
        cfg.validate()
