"""DistServe's placement searches (§4.1 Alg. 1 and §4.2 Alg. 2): the parallelism
of the prefill (prompt) and decoding (token) instances that maximises goodput per GPU, then
replication to a request rate.

Goodput of a configuration: the highest request rate (on a `RateLattice`, searched with
`search.max_rate`, every probe a cached `Evaluator` job) at which at least 90% of requests meet
the goodput SLOs (report/goodput.py), divided by the GPUs the configuration holds.

    scenario.py    Scenario, the catalog entries it names, the candidate parallelisms
    jobs.py        one simulation per job (phase, pair, replicated, colocated baseline); goodput
    algorithms.py  Alg. 1 (high_affinity), Alg. 2 (low_affinity), vLLM++ (vllm_plus_plus)
    command.py     `splitserve provision --objective goodput-per-gpu` (run_placement, print_placement)
"""

from __future__ import annotations

from .algorithms import high_affinity, low_affinity, vllm_plus_plus
from .command import PLACEMENTS, print_placement, run_placement
from .jobs import colocated_job, decode_job, goodput, pair_job, prefill_job, split_job
from .scenario import Scenario, fits, full_node, pair_candidates, phase_candidates, tensor_degrees

__all__ = [
    "PLACEMENTS",
    "Scenario",
    "colocated_job",
    "decode_job",
    "fits",
    "full_node",
    "goodput",
    "high_affinity",
    "low_affinity",
    "pair_candidates",
    "pair_job",
    "phase_candidates",
    "prefill_job",
    "print_placement",
    "run_placement",
    "split_job",
    "tensor_degrees",
    "vllm_plus_plus",
]
