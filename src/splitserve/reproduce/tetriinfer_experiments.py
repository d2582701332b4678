"""TetriInfer's experiments: the scales, the `tetri-*` requests, one
simulation of vLLM or TetriInfer with its averages and resource usage time, the comparison of the
two over the scale's seeds, and the instance flip under a load shift (tetriinfer.py says how
each follows the paper and what is ASSUMED)."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from importlib import resources

from ..catalog import kv_capacity_tokens, load_hardware, load_model
from ..cluster.designs import Parallelism, make_cluster
from ..policy.config import make_policy
from ..sim.config import SimConfig
from ..sim.simulator import Simulation
from ..workload import RequestSpec, request_workload

MODEL = "opt-13b"
CONTEXT = 2048                          # OPT's context: prompt + output clipped to it
LINKS = {"roce": False, "nvlink": True}  # TS-RoCE: the machines' network; TS-NVLink: colocated
LINK_NAMES = {"roce": "TS-RoCE", "nvlink": "TS-NVLink"}
WORKLOADS = ("lpld", "lphd", "hpld", "hphd", "mixed")
NAMES = {"lpld": "LPLD", "lphd": "LPHD", "hpld": "HPLD", "hphd": "HPHD", "mixed": "Mixed"}


def paper() -> dict:
    return tomllib.loads(resources.files("splitserve.reproduce").joinpath("tetriinfer_paper.toml").read_text())


@dataclass(frozen=True)
class Scale:
    name: str
    workloads: tuple[str, ...]
    requests: int
    seeds: tuple[int, ...]            # each point is the mean over these workload seeds
    links: tuple[str, ...]
    rates: tuple[float, ...]          # Poisson rates of the sensitivity table (req/s)
    shift_requests: int               # requests per phase of the flip experiment
    shift_rps: float
    flip_idles: tuple[float, ...]     # --flip-idle-s values of the flip experiment (inf: no flips)
    perf_model: str = "auto"          # the step-time model (simulate --perf-model)


TINY = Scale("tiny", ("lpld", "lphd"), 48, (0,), ("roce",), (4.0,), 60, 2.0, (60.0, 1.0, math.inf))
QUICK = Scale("quick", WORKLOADS, 128, tuple(range(10)), ("roce", "nvlink"), (1.0, 4.0, 16.0), 400, 2.0,
              (60.0, 10.0, 1.0, math.inf))
FULL = Scale("full", WORKLOADS, 128, tuple(range(40)), ("roce", "nvlink"), (0.5, 1.0, 2.0, 4.0, 8.0, 16.0),
             1200, 2.0, (60.0, 30.0, 10.0, 1.0, math.inf))
SCALES = {s.name: s for s in (TINY, QUICK, FULL)}


def specs(workload: str, n: int, seed: int, rps: float | None) -> list:
    """`n` requests of `tetri-<workload>`: all at t = 0 (rps None) or Poisson at `rps`."""
    wl = request_workload(f"tetri-{workload}", rps=rps or 1.0, duration=4 * n / (rps or 1.0) + 60, seed=seed,
                       max_requests=n, max_context=CONTEXT)
    out = list(wl)[:n]
    return [RequestSpec(0.0, s.prompt_tokens, s.output_tokens) for s in out] if rps is None else out


def simulate(system: str, reqs: list, link: str = "roce", prompt: int = 1, token: int = 1,
             flip_idle_s: float = 60.0, perf_model: str = "auto", memory_utilization: float = 0.9,
             vllm: dict | None = None, tetri: dict | None = None) -> dict:
    """Run `reqs` on vLLM (one instance) or TetriInfer (`prompt` + `token` instances); averages,
    resource usage time and flips. `vllm` / `tetri`: policy options over each system's here (the
    counterfactuals of tetriinfer_claims.py); `memory_utilization` sizes every instance's KV."""
    par = Parallelism(tp=1)
    if system == "vllm":
        cluster = make_cluster("baseline-a100", machines=1, parallel=par)
        policy = make_policy({"batching.preemption_limit": 0, **(vllm or {})}, "vllm")   # KV on demand (the
        # system's): a decode short of a block preempts the last-joined decode (limit 0: always it, as vLLM)
    else:
        cluster = make_cluster("splitwise-aa", prompt_machines=prompt, token_machines=token, parallel=par)
        policy = make_policy({"batching.scheduler": "tetriinfer-sjf", "routing.flip_idle_s": flip_idle_s,
                              **(tetri or {})}, "tetriinfer")
    sim = Simulation(cluster, load_model(MODEL), reqs,
                     SimConfig(policy=policy, record_requests=True, colocated=LINKS[link], perf_model=perf_model,
                               memory_utilization=memory_utilization))
    res = sim.run()
    rs = res.requests
    start = min(r.arrival for r in rs)
    last: dict[int, float] = {}
    for r in rs:
        last[r.prompt_machine] = max(last.get(r.prompt_machine, start), r.first_token_at)
        t = r.token_machine if r.token_machine >= 0 else r.prompt_machine
        last[t] = max(last.get(t, start), r.last_token_at)
    n = len(rs)
    return {"ttft_s": sum(r.first_token_at - r.arrival for r in rs) / n,
            "jct_s": sum(r.last_token_at - r.arrival for r in rs) / n,
            "resource_s": sum(t - start for t in last.values()),
            "makespan_s": max(r.last_token_at for r in rs) - start,
            "instances": len(sim.machines),
            "flips": [(f.at, f.machine, f.to.name.lower()) for f in sim.cls.flips],
            "preemptions": res.metrics.preemptions, "events": res.events}


def kv_tokens() -> int:
    """KV tokens one instance (one A100-80GB, tp 1) holds of OPT-13B, as the simulator sizes it."""
    return kv_capacity_tokens(load_model(MODEL), load_hardware("dgx-a100"), 1, 0.9)


def compare(workload: str, scale: Scale, link: str, rps: float | None, seeds: tuple[int, ...] | None = None,
            **options) -> dict:
    """TetriInfer against vLLM on `workload`, each averaged over the scale's seeds (or `seeds`);
    `options` go to `simulate` (a counterfactual's settings)."""
    runs: dict[str, list[dict]] = {"vllm": [], "tetriinfer": []}
    for seed in scale.seeds if seeds is None else seeds:
        reqs = specs(workload, scale.requests, seed, rps)
        for system in runs:
            runs[system].append(simulate(system, reqs, link, perf_model=scale.perf_model, **options))
    mean = {s: {k: sum(r[k] for r in rs) / len(rs) for k in ("ttft_s", "jct_s", "resource_s", "makespan_s")}
            for s, rs in runs.items()}
    v, t = mean["vllm"], mean["tetriinfer"]
    return {"workload": workload, "link": link, "rps": rps, "vllm": v, "tetriinfer": t,
            "ttft_cut": 1 - t["ttft_s"] / v["ttft_s"], "jct_cut": 1 - t["jct_s"] / v["jct_s"],
            "resource_cut": 1 - t["resource_s"] / v["resource_s"],
            "perf_per_dollar": (v["jct_s"] * v["resource_s"]) / (t["jct_s"] * t["resource_s"]),
            "preemptions": {s: sum(r["preemptions"] for r in rs) / len(rs) for s, rs in runs.items()}}


def flip_experiment(scale: Scale) -> dict:
    """A load shift on 2 prefill + 2 decode instances: `shift_requests` HPLD requests, then as many
    LPHD ones, Poisson at `shift_rps`; TetriInfer at each --flip-idle-s (inf: never flips)."""
    first = specs("hpld", scale.shift_requests, 0, scale.shift_rps)
    offset = first[-1].arrival
    second = [RequestSpec(s.arrival + offset, s.prompt_tokens, s.output_tokens)
              for s in specs("lphd", scale.shift_requests, 1, scale.shift_rps)]
    reqs = first + second
    out = {"requests": len(reqs), "rps": scale.shift_rps, "shift_at_s": offset, "runs": []}
    for idle in scale.flip_idles:
        r = simulate("tetriinfer", reqs, "roce", prompt=2, token=2, flip_idle_s=idle, perf_model=scale.perf_model)
        out["runs"].append({"flip_idle_s": idle, **{k: r[k] for k in ("ttft_s", "jct_s", "resource_s",
                                                                          "makespan_s", "flips")}})
    return out
