"""Clusters of instances: mixed machine kinds in one pool, parallelism per pool, and what they
cost."""

import pytest

from splitserve.catalog import load_hardware
from splitserve.designs import Parallelism, make_cluster
from splitserve.errors import UserError
from splitserve.simulate import run_simulation


def test_a_pool_may_mix_machine_kinds():
    c = make_cluster("splitwise-hh", prompt_machines="2*dgx-h100+1*dgx-a100", token_machines=1)
    assert [(i.name, p.name, n) for i, p, n in c.groups] == [
        ("dgx-h100", "PROMPT", 2), ("dgx-a100", "PROMPT", 1), ("dgx-h100", "TOKEN", 1)]
    assert c.label() == "splitwise-hh (2 dgx-h100 + 1 dgx-a100P, 1 dgx-h100T)"
    s = run_simulation(design="splitwise-hh", prompt_machines="2*dgx-h100+1*dgx-a100", token_machines="1",
                       rps=20, duration=20)
    h, a = load_hardware("dgx-h100"), load_hardware("dgx-a100")
    assert s["cluster"]["cost_per_hour"] == pytest.approx(3 * h.cost_per_hour + a.cost_per_hour)
    busy = {(m["pool"], m["hardware"]): m["utilization"] for m in s["cluster"]["machines"]}
    assert busy[("prompt", "dgx-a100")] > 0 and busy[("prompt", "dgx-h100")] > 0   # both kinds serve
    assert s["completed"] == s["requests"]


def test_parallelism_per_pool_and_pro_rata_cost():
    c = make_cluster("splitwise-aa", prompt_machines=3, token_machines=2,
                     parallel=Parallelism(prompt_tp=2, token_tp=4, token_pp=2))
    assert [(i.name, i.gpus, n) for i, _, n in c.groups] == [("dgx-a100/tp2pp1", 2, 3), ("dgx-a100/tp4pp2", 8, 2)]
    assert c.gpus == 3 * 2 + 2 * 8
    s = run_simulation(design="splitwise-aa", prompt_machines=3, token_machines=2, model="llama2-13b",
                       parallel=Parallelism(prompt_tp=2, token_tp=4, token_pp=2), rps=5, duration=20)
    a = load_hardware("dgx-a100")
    assert s["cluster"]["gpus"] == 22
    assert s["cluster"]["cost_per_hour"] == pytest.approx(22 / 8 * a.cost_per_hour)


@pytest.mark.parametrize("kw,msg", [
    ({"machines": "2*dgx-nope"}, "unknown hardware"),
    ({"machines": "two"}, "give a count"),
    ({"machines": 2, "parallel": Parallelism(tp=16)}, "tensor parallel 16 must be between 1 and 8"),
    ({"machines": 2, "parallel": Parallelism(prompt_tp=2)}, "not prompt/token parallelism"),
])
def test_errors_name_what_to_fix(kw, msg):
    with pytest.raises(UserError, match=msg):
        make_cluster("baseline-a100", **kw)
