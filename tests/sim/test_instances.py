"""Clusters of instances: mixed machine kinds in one pool, parallelism per pool, and what they
cost."""

import pytest

from splitserve.catalog import load_hardware
from splitserve.cluster.designs import Parallelism, make_cluster
from splitserve.errors import UserError
from splitserve.sim.run import run_simulation


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


@pytest.mark.parametrize("model", ["llama2-7b", "llama2-13b", "codellama-34b", "llama2-70b", "opt-13b", "opt-66b",
                                   "opt-175b", "bloom-176b", "mixtral-8x7b"])
def test_every_model_runs_at_every_parallelism_that_holds_it(model):
    """Each model of the seeds, every (tp, pp) of up to two A100 machines that holds its weights, split
    and unsplit; mixtral with its experts spread over the tensor-parallel GPUs as well."""
    from splitserve.catalog import kv_capacity_tokens, load_model

    spec, hw = load_model(model), load_hardware("dgx-a100")
    ran = 0
    for tp in (1, 2, 4, 8):
        for pp in (1, 2):
            try:
                kv_capacity_tokens(spec, hw, tp, 0.9, pp)
            except UserError:
                continue
            eps = [None, tp] if spec.experts > 1 and spec.experts % tp == 0 and tp > 1 else [None]
            for ep in eps:
                par = Parallelism(tp=tp, pp=pp, ep=ep)
                for kw in ({"design": "baseline-a100", "machines": 1},
                           {"design": "splitwise-aa", "prompt_machines": 1, "token_machines": 1}):
                    s = run_simulation(**kw, model=model, parallel=par, rps=1.0, duration=8, max_context=2048)
                    assert s["completed"] == s["requests"] > 0
                    assert s["cluster"]["gpus"] == tp * pp * (1 if "machines" in kw else 2)
                    ran += 1
    assert ran >= 4
