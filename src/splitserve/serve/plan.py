"""`serve --plan FILE`: the cluster a `provision` (provision.json) or `simulate` run (summary.json)
chose, as serve's pools: worker counts, tensor parallel per pool, the model and the policy.

A plan counts model instances: a Splitwise/baseline design's machine is one instance at tp = its
GPUs (a DGX: 8); simulate's `--tp` and the configuration and placement searches name their own tp
and pp. Read from each file kind:

    provision.json, --objective cost|power|machines|throughput|batch   best design, its machine counts
    provision.json, --objective capacity-per-dollar                    best configuration x its unit
    provision.json, --objective goodput-per-gpu (DistServe placement)  prefill/decode instances, tp, pp
    summary.json (simulate)                                            cluster.machines, policy options

`fit` shrinks a plan to what this host has (--scale-to-fit): GPUs, or CPU cores with --device cpu
(one per tensor-parallel process; at least one worker per pool), keeping the prompt:token ratio as
near as it can and each tp one the model's heads can take; each change is one line. Serve has no
pipeline parallelism: a plan at pp > 1 is refused, or served at pp 1 when scaled to fit.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..errors import UserError
from .gpus import describe

if TYPE_CHECKING:
    from ..catalog import Catalog

SPLIT = ("prompt", "token")


@dataclass(frozen=True, slots=True)
class Pool:
    count: int       # workers (model instances)
    tp: int = 1      # tensor parallel of each
    pp: int = 1      # pipeline stages of each (serve runs 1)


@dataclass(frozen=True, slots=True)
class Plan:
    kind: str                                   # what the file was, for messages
    model: str                                  # the catalog model it planned for
    pools: dict[str, Pool]                      # prompt and token (and mixed), or mixed alone
    policy: dict[str, Any] = field(default_factory=dict)   # policy settings by path (policy/config.py)
    system: str = ""                            # its --policy
    max_num_seqs: int | None = None             # a configuration search's batch cap

    @property
    def split(self) -> bool:
        return "prompt" in self.pools

    @property
    def gpus(self) -> int:
        return sum(p.count * p.tp * p.pp for p in self.pools.values())

    def describe(self) -> str:
        return describe([(name, p.count, p.tp) for name, p in self.pools.items()])


def read_plan(path: str | Path) -> Plan:
    """The plan in `path` (UserError, one line, for a file that cannot be read or is no plan)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise UserError(f"--plan {p}: cannot read it: {e.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"--plan {p}: not JSON ({str(e).splitlines()[0]}): give a provision.json or a "
                        f"simulate summary.json") from None
    if not isinstance(data, dict):
        raise UserError(f"--plan {p}: not a provision.json nor a simulate summary.json")
    try:
        if isinstance(data.get("cluster"), dict) and "machines" in data["cluster"]:
            plan = _from_summary(data)
        elif data.get("objective") == "goodput-per-gpu":
            plan = _from_placement(data)
        elif data.get("objective") == "capacity-per-dollar":
            plan = _from_configs(data)
        elif "best" in data and "scenario" in data:
            plan = _from_provision(data)
        else:
            raise UserError("not a provision.json nor a simulate summary.json (neither `best` and `scenario` "
                            "nor `cluster.machines`)")
    except UserError as e:
        raise UserError(f"--plan {p}: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UserError(f"--plan {p}: a malformed plan ({type(e).__name__}: {e})") from None
    if not plan.pools or any(x.count < 1 or x.tp < 1 or x.pp < 1 for x in plan.pools.values()):
        raise UserError(f"--plan {p}: no workers in it ({plan.kind})")
    return plan


def _catalog(data: dict) -> Catalog:
    from ..catalog import load_catalog

    where = (data.get("config") or {}).get("catalog")
    return load_catalog(where if where and Path(where).is_dir() else None)


def _from_provision(d: dict) -> Plan:
    best = d["best"]
    if best is None:
        raise UserError("the provision found no design that meets its SLOs: nothing to serve")
    cat = _catalog(d)
    design = cat.designs[best["design"]]
    gpus = lambda hw: cat.hardware_spec(hw).gpus   # a machine is one instance at tp = its GPUs
    if design.split:
        pools = {"prompt": Pool(best["prompt_machines"], gpus(design.prompt)),
                 "token": Pool(best["token_machines"], gpus(design.token))}
    else:
        pools = {"mixed": Pool(best["machines"], gpus(design.machine))}
    sc = d["scenario"]
    return Plan(f"provision.json ({d['objective']}: {best['design']})", sc["model"], pools,
                system=sc.get("system") or "")


def _from_configs(d: dict) -> Plan:
    from ..policy.schedulers import vllm_allocation

    best = d["best"]
    if best is None:
        raise UserError("the configuration search found no configuration that meets its SLO: nothing to serve")
    name = d["best_design"]
    unit = next(r["unit"] for r in d["designs"] if r["design"] == name)
    design = _catalog(d).designs[name]
    shape = Pool(1, best["tp"], best["pp"])
    pools = ({"prompt": replace(shape, count=unit[0]), "token": replace(shape, count=unit[1])} if design.split
             else {"mixed": replace(shape, count=unit[0])})
    policy = {"batching.scheduler": best["scheduler"],   # and its KV, as the search simulated it (configs.py)
              "batching.kv_allocation": vllm_allocation(best["scheduler"])}
    if best.get("chunk"):
        policy["batching.chunk_size"] = best["chunk"]
    return Plan(f"provision.json (capacity-per-dollar: {name} {best['label']})", d["scenario"]["model"], pools,
                policy, max_num_seqs=best.get("batch_cap") or None)


def _from_placement(d: dict) -> Plan:
    from ..policy.schedulers import vllm_allocation

    if not d.get("feasible"):
        raise UserError("the placement search found no placement that meets its SLOs: nothing to serve")
    pools = {"prompt": Pool(d["prefill_instances"], d["prefill"]["tp"], d["prefill"]["pp"]),
             "token": Pool(d["decode_instances"], d["decode"]["tp"], d["decode"]["pp"])}
    return Plan(f"provision.json (goodput-per-gpu: {d['algorithm']})", d["model"], pools,
                {"routing.mixed_pool": False,   # DistServe's pools and KV, as the placement simulated them
                 "batching.kv_allocation": vllm_allocation(d.get("scheduler"))})


LABEL = re.compile(r"(?P<hw>[^/]+)(?:/tp(?P<tp>\d+)pp(?P<pp>\d+)(?:ep\d+)?)?")


def _from_summary(d: dict) -> Plan:
    from ..policy.config import OPTIONS

    cat: Catalog | None = None
    pools: dict[str, Pool] = {}
    for m in d["cluster"]["machines"]:
        if not m["count"]:
            continue
        label = LABEL.fullmatch(m["hardware"])
        if label is None:
            raise ValueError(f"machine {m['hardware']!r}")
        if label["tp"]:
            tp, pp = int(label["tp"]), int(label["pp"])
        else:                                         # the whole machine: tp = its GPUs
            cat = cat or _catalog(d)
            tp, pp = cat.hardware_spec(label["hw"]).gpus, 1
        old = pools.get(m["pool"])
        if old is not None and (old.tp, old.pp) != (tp, pp):
            raise UserError(f"its {m['pool']} pool mixes tp {old.tp} pp {old.pp} and tp {tp} pp {pp} instances; "
                            f"serve runs one tp per pool")
        pools[m["pool"]] = Pool((old.count if old else 0) + m["count"], tp, pp)
    if "prompt" in pools and "token" not in pools or "token" in pools and "prompt" not in pools:
        raise UserError("it has a prompt or a token pool without the other")
    conf = d.get("config") or {}
    policy = {}
    for o in OPTIONS:
        v = conf.get(o.name)
        if o.flag and v is True:
            policy[o.path] = o.given(True)
        elif not o.flag and v is not None:
            policy[o.path] = v
    return Plan(f"summary.json ({d.get('cluster_label') or d['design']})", d["model"], pools, policy,
                system=conf.get("policy") or "")


def fit(plan: Plan, slots: int, tp_ok: Callable[[int], bool], where: str) -> tuple[Plan, list[str]]:
    """`plan` shrunk to `slots` GPUs (or CPU cores: one per tensor-parallel process), and a line per
    change: pp to 1, each tp to one the model takes and small enough that one worker per pool fits,
    then the worker counts (each pool at least one; the prompt:token ratio as near as it can be).
    `where` says what the slots are ("this host has 2 GPUs"). Where every tp is 1 and even one
    worker per pool does not fit, one worker per pool it is (they share the GPUs: gpus.py)."""
    lines, pools = [], dict(plan.pools)
    for name, p in pools.items():
        if p.pp != 1:
            lines.append(f"{name} pp {p.pp} -> 1 (serve has no pipeline parallelism)")
            pools[name] = p = replace(p, pp=1)
        ok = _largest_tp(p.tp, tp_ok)
        if ok != p.tp:
            lines.append(f"{name} tp {p.tp} -> {ok} (the model's heads cannot take tp {p.tp})")
            pools[name] = replace(p, tp=ok)
    before = {name: p.tp for name, p in pools.items()}
    while sum(p.tp for p in pools.values()) > slots and any(p.tp > 1 for p in pools.values()):
        name = max(pools, key=lambda n: pools[n].tp)
        pools[name] = replace(pools[name], tp=_largest_tp(pools[name].tp // 2, tp_ok))
    lines += [f"{name} tp {before[name]} -> {p.tp} ({where})" for name, p in pools.items() if p.tp != before[name]]
    counts = _counts(pools, max(slots, len(pools)))
    lines += [f"{name} workers {pools[name].count} -> {n} ({where})" for name, n in counts.items()
              if n != pools[name].count]
    return replace(plan, pools={name: replace(p, count=counts[name]) for name, p in pools.items()}), lines


def _largest_tp(tp: int, tp_ok: Callable[[int], bool]) -> int:
    return next(t for t in range(max(1, tp), 0, -1) if t == 1 or tp_ok(t))


def _counts(pools: dict[str, Pool], slots: int) -> dict[str, int]:
    """Workers per pool within `slots` (each pool's tp fixed), at most the plan's: unchanged when
    they fit; else, split, the (prompt, token) whose ratio is nearest the plan's (then the most
    slots used), and a mixed pool beside them in proportion, on what is left."""
    need = lambda c: sum(n * pools[k].tp for k, n in c.items())
    if need({k: p.count for k, p in pools.items()}) <= slots:
        return {k: p.count for k, p in pools.items()}
    if set(SPLIT) <= set(pools):
        (P, tp_p), (T, tp_t) = ((pools[k].count, pools[k].tp) for k in SPLIT)
        mixed = pools.get("mixed")
        room = slots - (mixed.tp if mixed else 0)
        cands = [(p, t) for p in range(1, P + 1) for t in range(1, T + 1) if p * tp_p + t * tp_t <= room]
        p, t = min(cands, key=lambda c: (round(abs(math.log(c[0] / c[1] * T / P)), 9), -(c[0] * tp_p + c[1] * tp_t)),
                   default=(1, 1))
        out = {"prompt": p, "token": t}
        if mixed:
            left = (slots - p * tp_p - t * tp_t) // mixed.tp
            out["mixed"] = max(1, min(mixed.count, left, math.ceil(mixed.count * (p + t) / (P + T))))
        return out
    m = pools["mixed"]
    return {"mixed": max(1, min(m.count, slots // m.tp))}
