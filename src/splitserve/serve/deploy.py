"""A plan (plan.py) made into the ServeConfig that serves it: `serve --plan FILE [--scale-to-fit]`.

The plan sets the pools (worker counts, tp per pool), the model where the engine has a preset of
that name (else --model stays, and a line says so) and the policy it chose; a policy option, --model
or --max-num-seqs given on the command line wins. It is checked against this host before anything
starts: the GPUs it needs (or, with --device cpu, the CPU cores: the plan's GPUs are not there), a
tp the model's heads can take, pp 1. `--scale-to-fit` shrinks it to fit instead (plan.fit), one line
per change; without it each misfit is one error line. On a Ray backend the GPUs are the Ray
cluster's, checked when serve joins it (launcher.join_ray), and --scale-to-fit is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import UserError
from .config import ServeConfig
from .plan import Plan, fit


@dataclass(frozen=True, slots=True)
class Given:
    """What the command line gave beside --plan (it wins over the plan)."""

    model: bool = False
    max_num_seqs: bool = False
    policy: dict[str, Any] = field(default_factory=dict)   # policy settings by path
    system: str = ""


def tp_ok(model_cfg, tp: int) -> bool:
    """Whether the model's heads can take `tp` (engine/sharding.py)."""
    if tp == 1:
        return True
    from ..engine.sharding import check_tp

    try:
        check_tp(model_cfg, tp)
    except UserError:
        return False
    return True


def host_slots(cfg: ServeConfig) -> tuple[int, bool, str]:
    """(slots, on GPUs, what they are): this host's GPUs for CUDA workers, else its CPU cores (one
    per tensor-parallel process of --worker-threads threads)."""
    from .gpus import cpu_cores, gpus_present

    if cfg.worker_mode == "engine" and cfg.device != "cpu":
        n = len(gpus_present())
        if n or cfg.device != "auto":
            return n, True, f"this host has {n} GPU{'s' * (n != 1)}"
    cores = cpu_cores()
    return max(1, cores // max(1, cfg.worker_threads)), False, f"{cores} CPU core{'s' * (cores != 1)}"


def apply_plan(cfg: ServeConfig, plan: Plan, path: str, scale: bool, given: Given,
               log: Callable[[str], None]) -> None:
    """Set `cfg`'s pools, model and policy from `plan`, checked against this host (UserError), or
    shrunk to it where `scale`; `log` gets a line per change and one for what will be served."""
    from ..engine.presets import is_preset
    from ..policy.config import make_policy

    if given.model:
        if cfg.model != plan.model:
            log(f"model {cfg.model} (--model; the plan's is {plan.model})")
    elif is_preset(plan.model):
        cfg.model = plan.model
    else:
        log(f"model {cfg.model}: the plan's model {plan.model} has no engine preset; give --model DIR "
            f"(its checkpoint) to serve it")
    model_cfg = cfg.model_config()
    ray = cfg.backend == "ray"       # its GPUs are the Ray cluster's, checked when serve joins it
    if scale and ray:
        raise UserError("--scale-to-fit fits a plan to this host; with --backend ray the Ray cluster's GPUs are "
                        "checked against the plan when serve joins it: leave --scale-to-fit out")
    slots, on_gpus, where = (0, True, "") if ray else host_slots(cfg)
    if scale:
        plan, lines = fit(plan, slots, lambda tp: tp_ok(model_cfg, tp), where)
        for line in lines:
            log(line)
    else:
        for name, p in plan.pools.items():
            if p.pp != 1:
                raise UserError(f"--plan {path}: its {name} pool runs pipeline parallel {p.pp}; serve has none: "
                                f"give --scale-to-fit to serve it at pp 1")
            if p.tp > 1 and cfg.worker_mode == "engine" and not tp_ok(model_cfg, p.tp):
                from ..engine.sharding import check_tp
                try:
                    check_tp(model_cfg, p.tp)
                except UserError as e:          # the heads it cannot split, in one line
                    raise UserError(f"--plan {path}: {cfg.model}, {name} pool: {e}; or give --scale-to-fit") from None
        if cfg.worker_mode == "engine" and not ray and (plan.gpus > slots or not on_gpus):   # echo: no tp
            host = (where if on_gpus else f"--device {cfg.device} runs on none (this host has {where})")
            raise UserError(f"--plan {path}: {plan.describe()} need {plan.gpus} GPUs; {host}: give --scale-to-fit "
                            f"to shrink the plan to this host")
    policy = make_policy({**plan.policy, **given.policy}, given.system or plan.system)
    if policy.split is not None and policy.split != plan.split:
        raise UserError(f"--policy {policy.system} {'splits' if policy.split else 'does not split'} the phases; "
                        f"the plan {'does' if plan.split else 'does not'}: leave --policy out")
    pools = plan.pools
    cfg.policy = policy
    cfg.design = "splitwise" if plan.split else "baseline"
    cfg.prompt_workers, cfg.token_workers = (pools[k].count if k in pools else 0 for k in ("prompt", "token"))
    cfg.mixed_workers = pools["mixed"].count if "mixed" in pools else 0
    cfg.prompt_tp, cfg.token_tp = (pools[k].tp if k in pools else None for k in ("prompt", "token"))
    cfg.tp = pools["mixed"].tp if "mixed" in pools else 1
    if plan.max_num_seqs and not given.max_num_seqs:
        cfg.max_num_seqs = plan.max_num_seqs
    alloc = policy.batching.kv_allocation
    log(f"serving {plan.kind}: {plan.describe()}, model {cfg.model}"
        + (f", policy {policy.system}" if policy.system else "") + f", KV {alloc}"
        + ("" if "batching.kv_allocation" in given.policy else
           f" as the plan was simulated (--kv-allocation {'on-demand' if alloc == 'reserve' else 'reserve'} "
           f"to serve otherwise)"))
