"""Serving systems by name (`--policy NAME`): each a set of policy settings that makes splitserve
schedule as that system does, and whether it splits the phases.

A system is nothing but settings of the policy options (policy/config.py OPTIONS, by path), so the
simulator, `provision` and the live router run it with the same code as any other setting. An
option given on the command line wins over the system's value for it, even when it gives the
option's default (`--policy aladdin --scale-window 0`: no scaling); an option not given takes the
system's. `compare` (compare/) runs them side by side.

    vllm         unsplit; vLLM v0's prefill-first iterations, JSQ over the machines
    sarathi      unsplit; Sarathi-Serve's stall-free chunked prefill (512-token chunks)
    splitwise    prompt and token pools, mixed pool for overflow (the paper's defaults)
    distserve    prompt and token pools, no mixed pool, prefill-first batching; the token machine
                 reserves the KV before the prefill (DistServe pulls it after, --kv-pull: simulated
                 only, so not part of the system that also runs live)
    tetriinfer   prompt and token pools, no mixed pool; 512-token chunks FCFS on prompt machines,
                 decode dispatch by predicted length (power of two, heavy/light), its 200-token
                 bucket predictor (74.9%); an instance idle for a minute flips role
                 (policy/instance_flip.py)
    aladdin      unsplit; Aladdin's best-fit placement by predicted KV and batch latency against
                 TTFT and ATGT SLOs, re-prediction of outlived lengths, workers scaled to the
                 arrival rate of the last 30 s (policy/aladdin.py), the 100-token bucket predictor
    ecoserve     unsplit, JSQ; EcoServe's machine scheduler (policy/schedulers/ecoserve/): prompt
                 and generation queues, KV for the predicted output (its ShareGPT estimate, 73.2% at
                 15% padding), same-length groups, KV-cache pipelining

KV memory (policy/kv_allocation.py): vllm, sarathi, distserve, tetriinfer and aladdin allocate it on
demand, as those systems do (vLLM's paged blocks; DistServe, TetriInfer and Aladdin run on vLLM);
splitwise reserves each request's prompt and output, as the Splitwise authors' simulator does
(their live system runs on vLLM); ecoserve reserves by its predictions, its own rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import UserError


@dataclass(frozen=True, slots=True)
class System:
    name: str
    split: bool                                   # prompt and token machines apart
    settings: dict[str, Any] = field(default_factory=dict)   # option path -> value
    summary: str = ""


SYSTEMS: dict[str, System] = {s.name: s for s in (
    System("vllm", False, {"routing.cluster_scheduler": "jsq", "batching.scheduler": "vllm", "batching.kv_allocation": "on-demand"},
           "unsplit, prefill-first iterations (vLLM v0)"),
    System("sarathi", False, {"routing.cluster_scheduler": "jsq", "batching.scheduler": "sarathi", "batching.kv_allocation": "on-demand"},
           "unsplit, stall-free chunked prefill (Sarathi-Serve)"),
    System("splitwise", True, {}, "prompt, token and mixed pools (Splitwise)"),
    System("distserve", True, {"routing.mixed_pool": False, "batching.scheduler": "vllm", "batching.kv_allocation": "on-demand"},
           "prompt and token pools, no mixed pool (DistServe)"),
    System("tetriinfer", True, {"routing.mixed_pool": False, "routing.decode_dispatch": "tetriinfer",
                                "routing.predictor": "tetriinfer-200", "batching.scheduler": "tetriinfer-fcfs",
                                "routing.cluster_scheduler": "tetriinfer", "batching.kv_allocation": "on-demand"},
           "chunked prefill, decode dispatch by predicted length (TetriInfer)"),
    System("aladdin", False, {"routing.cluster_scheduler": "aladdin", "routing.predictor": "tetriinfer-100",
                              "routing.scale_window": 30.0, "batching.kv_allocation": "on-demand"},
           "best-fit placement for SLOs, workers scaled to the arrival rate (Aladdin)"),
    System("ecoserve", False, {"routing.cluster_scheduler": "jsq", "batching.scheduler": "ecoserve",
                               "routing.predictor": "ecoserve-sharegpt"},
           "KV for the predicted output, same-length groups, KV-cache pipelining (EcoServe)"),
)}


def system(name: str) -> System:
    """The system `name`; UserError lists the names."""
    if name not in SYSTEMS:
        raise UserError(f"unknown --policy {name!r}; choose one of: {', '.join(SYSTEMS)}")
    return SYSTEMS[name]


def apply(name: str, values: dict[str, Any]) -> dict[str, Any]:
    """{path: value}: system `name`'s settings, and over them the options given (`values`)."""
    return {**system(name).settings, **values}
