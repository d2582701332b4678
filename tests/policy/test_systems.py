"""`--policy NAME`: a serving system is a set of policy settings (policy/systems.py); options given
beside it win; an unsplit system runs a Splitwise design's machines as one mixed pool."""

from __future__ import annotations

import pytest

from splitserve.errors import UserError
from splitserve.policy.config import OPTIONS, PolicyConfig, make_policy
from splitserve.policy.systems import SYSTEMS
from splitserve.sim.run import run_simulation

PATHS = {o.path for o in OPTIONS}


@pytest.mark.parametrize("name", list(SYSTEMS))
def test_every_system_is_valid_settings_of_existing_options(name):
    s = SYSTEMS[name]
    assert set(s.settings) <= PATHS
    cfg = make_policy({}, name)
    assert cfg.system == name and cfg.split is s.split
    for path, v in s.settings.items():
        section, _, field = path.rpartition(".")
        assert getattr(getattr(cfg, section) if section else cfg, field) == v


def test_an_option_given_beside_the_system_wins():
    cfg = make_policy({"batching.scheduler": "orca"}, "vllm")
    assert cfg.batching.scheduler == "orca" and cfg.routing.cluster_scheduler == "jsq"
    assert make_policy({}, "") == PolicyConfig()
    with pytest.raises(UserError, match="unknown --policy 'nope'"):
        make_policy({}, "nope")


def test_an_unsplit_system_runs_the_design_machines_mixed_and_a_split_one_needs_pools():
    kw = dict(design="splitwise-hh", prompt_machines=2, token_machines=1, rps=2.0, duration=10.0)
    s = run_simulation(**kw, policy=make_policy({}, "vllm"))
    assert s["completed"] == s["requests"] > 0
    assert s["cluster_label"] == "splitwise-hh unsplit (2 + 1 machines)"
    assert [(m["pool"], m["count"]) for m in s["cluster"]["machines"]] == [("mixed", 3)]
    with pytest.raises(UserError, match="--policy splitwise splits the phases"):
        run_simulation(design="baseline-h100", machines=3, rps=2.0, duration=10.0, policy=make_policy({}, "splitwise"))


def test_provision_runs_a_system_on_its_kind_of_designs_only():
    from splitserve.provision.command import run_provision
    from splitserve.provision.request import ProvisionRequest

    kw = dict(objective="machines", rps=2.0, constraint=None, budget=None, duration=20.0, max_machines=6,
              max_prompt=4, max_token=4, use_cache=False, progress=False, workers=1)
    res = run_provision(ProvisionRequest(**kw, system="vllm"))
    assert [r["design"] for r in res["designs"]] == ["baseline-a100", "baseline-h100"]
    assert res["scenario"]["system"] == "vllm" and res["best"] is not None
    with pytest.raises(UserError, match="--policy distserve splits the phases: baseline-h100 is unsplit"):
        ProvisionRequest(**kw, designs=("splitwise-hh", "baseline-h100"), system="distserve")
    res = run_provision(ProvisionRequest(**kw, system="distserve"))
    assert all(r["design"].startswith("splitwise") for r in res["designs"])


def test_an_option_given_on_the_command_line_wins_even_at_its_default(capsys):
    import json

    from splitserve.cli import main

    args = ["simulate", "--policy", "aladdin", "--design", "baseline-h100", "-m", "3", "--rps", "2",
            "--duration", "20", "--json", "-q"]

    def scaling(*extra):
        assert main([*args, *extra]) == 0
        return json.loads(capsys.readouterr().out)["scaling"]

    # aladdin's system scales over a 30 s window; --scale-window 0 (the option's default) is no scaling
    assert scaling()["scale_downs"] > 0
    assert scaling("--scale-window", "0")["scale_downs"] == 0
