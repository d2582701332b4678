"""What runs and what waits on each pool, and the KV-cache usage of each: the router's view, as the
metrics (metrics.py) and the stats line (stats_log.py) show it."""

from __future__ import annotations

from ..policy.state import Phase
from .messages import Stage


def kv_usage(workers) -> dict[str, float]:
    """KV blocks in use over all blocks (0-1) of the live workers, per pool (a worker's home: its
    role now) and over all ("all"), from their last heartbeats."""
    used: dict[str, list[int]] = {"all": [0, 0]}
    for w in workers:
        if w.up and w.blocks:
            for key in (w.home, "all"):
                u = used.setdefault(key, [0, 0])
                u[0] += w.blocks - w.free
                u[1] += w.blocks
    return {k: (u[0] / u[1] if u[1] else 0.0) for k, u in used.items()}


def request_counts(router) -> dict[str, tuple[int, int]]:
    """(running, waiting) requests per pool (metrics_vllm.py, vLLM's two gauges): a request waits
    while it is parked, unrouted, waiting for KV memory (on its token worker's pool) or queued for
    its prompt worker (prefill not started, or to be recomputed after a preemption); it runs while
    its prefill runs (prompt worker's pool), in KV transfer, ready or decoding (token worker's
    pool)."""
    machines = router.cluster.view.machines if router.cluster is not None else []
    out: dict[str, list[int]] = {}
    for req in router.active.values():
        r = req.pr
        if r is None or req.stage in (Stage.NEW, Stage.PARKED) or r.prompt_machine < 0:
            out.setdefault("none", [0, 0])[1] += 1
            continue
        waiting = r.phase is Phase.QUEUED or r.phase is Phase.WAITING or req.stage is Stage.WAITING
        on_prompt = r.phase is Phase.QUEUED or r.phase is Phase.PREFILL
        wid = r.prompt_machine if on_prompt and req.stage is not Stage.WAITING or r.token_machine < 0 \
            else r.token_machine
        pool = machines[wid].pool.name.lower() if 0 <= wid < len(machines) else "none"
        out.setdefault(pool, [0, 0])[1 if waiting else 0] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}
