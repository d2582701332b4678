"""One simulation per cluster configuration, evaluated in parallel and cached.

A `Job` names everything a simulation depends on; `run_job` runs it and keeps only what the
searches need (an `Outcome`). The `Evaluator` answers a batch of jobs from its cache where it can
and sends the rest to a backend: a local process pool or a Ray cluster (provision/ray_backend.py).

The cache is a directory of small JSON files, one per job, keyed by a hash of the job, the
content of its profile CSV and the source of the splitserve package itself, so that a change to
the simulator never serves stale results.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..cluster.designs import Parallelism
from ..nodes.fingerprint import code_fingerprint
from ..perf import check_perf_model
from ..policy.config import PolicyConfig, make_policy
from ..report.goodput import GoodputSLO
from ..sim.run import run_simulation

if TYPE_CHECKING:
    from ..catalog import Catalog


@dataclass(frozen=True, slots=True)
class Job:
    design: str
    prompt: int | None          # Splitwise designs
    token: int | None
    machines: int | None        # baselines
    rps: float
    workload: str = "coding"
    duration: float = 120.0
    seed: int = 0
    model: str = "llama2-70b"
    profile: str | None = None
    goodput: tuple[float, float] | None = None   # (TTFT, TPOT) SLOs, s: DistServe's attainment is the SLO
    # DistServe's simulations (provision/placement/); the defaults are the Splitwise searches'
    parallel: tuple | None = None   # designs.Parallelism fields: (tp, pp, prompt_tp, prompt_pp, token_tp, token_pp)
    scheduler: str | None = None    # machine-level scheduler by name (policy BatchingConfig.scheduler)
    mixed_pool: bool = True         # False: DistServe's pools, no overflow into a mixed pool
    colocated: bool = False         # prompt and token instances share nodes: KV over NVLink
    max_context: int | None = None  # clip prompt + output (the model's context)
    batch_cap: int = 0              # requests holding KV at once (BatchingConfig.max_seqs; 0: memory decides)
    chunk_size: int = 0             # chunked prefill's token budget (0: whole prompts)
    system: str = ""                # a serving system by name (policy/systems.py); "": the default policy
    kv_allocation: str = ""         # reserve or on-demand (policy/kv_allocation.py); "": the system's or default
    catalog: Catalog | None = None  # a user catalog (--catalog) travels with the job; None: the built-in one
    perf_model: str = "auto"        # the step-time model where no profile applies (simulate --perf-model)
    decode_lookup: str = "batch-size"   # how decode times are read off the profile (simulate --decode-lookup)
    token_tbt_slo: float = 0.0      # a latency-aware full token machine (RoutingConfig.token_tbt_slo; 0: off)
    rate_profile: str = ""          # a rate shape whose mean is `rps` (workload/shape.py; provision --day); "": constant

    def counts(self) -> dict:
        if self.machines is not None:
            return {"machines": self.machines}
        return {"prompt_machines": self.prompt, "token_machines": self.token}

    def label(self) -> str:
        if self.machines is not None:
            return f"{self.design} ({self.machines} machines)"
        return f"{self.design} ({self.prompt}P, {self.token}T)"


@dataclass(frozen=True, slots=True)
class Outcome:
    slo_met: bool
    violation: float            # the worst of the nine checks, as slowdown / limit (<= 1: met)
    worst: str                  # which check that is, e.g. "ttft_p99"
    slowdowns: dict
    throughput_rps: float
    requests: int
    completed: int
    cost_per_hour: float
    power_kw: float
    machines: int
    wall_s: float
    attainment: float | None = None   # goodput SLO attainment (with a job's `goodput`)
    gpus: int | None = None

    @classmethod
    def from_summary(cls, s: dict) -> "Outcome":
        """With a `goodput` block (the job set goodput SLOs) the SLO is DistServe's: attainment at
        least its target; the violation is target / attainment. Otherwise the nine slowdowns."""
        checks = s["slo"]["checks"]
        ratio = {k: (c["slowdown"] if c["slowdown"] is not None else float("inf")) / c["limit"]
                 for k, c in checks.items()}
        worst = max(ratio, key=ratio.__getitem__)
        met = bool(s["slo"]["met"])
        g = s.get("goodput")
        if g is not None:
            met, worst = bool(g["meets_target"]), "goodput_attainment"
            ratio[worst] = g["target"] / g["attainment"] if g["attainment"] else float("inf")
        c = s["cluster"]
        return cls(slo_met=met, violation=ratio[worst], worst=worst,
                   slowdowns={k: v["slowdown"] for k, v in checks.items()},
                   throughput_rps=s["throughput_rps"], requests=s["requests"], completed=s["completed"],
                   cost_per_hour=c["cost_per_hour"], power_kw=c["power_kw"],
                   machines=c["machine_count"], wall_s=s["sim"]["wall_s"],
                   attainment=g["attainment"] if g is not None else None, gpus=c.get("gpus"))


def job_policy(job: Job):
    """The PolicyConfig a job runs under: the default or its serving system's, without the mixed
    pool and with a named machine scheduler when the job says so."""
    pol = make_policy({}, job.system) if job.system else PolicyConfig()
    if not job.mixed_pool:
        pol = replace(pol, routing=replace(pol.routing, mixed_pool=False))
    if job.scheduler is not None:
        pol = replace(pol, batching=replace(pol.batching, scheduler=job.scheduler))
    if job.batch_cap or job.chunk_size:
        pol = replace(pol, batching=replace(pol.batching, max_seqs=job.batch_cap, chunk_size=job.chunk_size))
    if job.kv_allocation:
        pol = replace(pol, batching=replace(pol.batching, kv_allocation=job.kv_allocation))
    if job.token_tbt_slo:
        pol = replace(pol, routing=replace(pol.routing, token_tbt_slo=job.token_tbt_slo))
    return pol


def run_job(job: Job) -> Outcome:
    s = run_simulation(design=job.design, **job.counts(), model=job.model, workload=job.workload,
                       rps=job.rps, duration=job.duration, seed=job.seed, profile=job.profile,
                       goodput=GoodputSLO(*job.goodput) if job.goodput else None,
                       parallel=Parallelism(*job.parallel) if job.parallel else None,
                       policy=job_policy(job), max_context=job.max_context, colocated=job.colocated,
                       catalog=job.catalog, perf_model=job.perf_model, decode_lookup=job.decode_lookup,
                       rate_profile=job.rate_profile or None)
    return Outcome.from_summary(s)


@lru_cache(maxsize=32)
def _file_hash(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "splitserve" / "provision"


@dataclass
class Cache:
    root: Path

    def key(self, job: Job) -> str:
        d = asdict(replace(job, catalog=None))
        if job.catalog is not None:      # the user files' hash, not their parsed contents
            d["catalog"] = job.catalog.fingerprint
        if job.profile:
            d["profile"] = _file_hash(job.profile)
        shape = job.rate_profile.split(":")[0]
        if shape.lower().endswith(".json"):     # a shape file: its content
            d["rate_shape_file"] = _file_hash(shape)
        d["code"] = code_fingerprint()
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:24]

    def get(self, job: Job) -> Outcome | None:
        path = self.root / f"{self.key(job)}.json"
        try:
            return Outcome(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def put(self, job: Job, out: Outcome) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"{self.key(job)}.json"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(out)))
        tmp.replace(path)                      # atomic: a reader never sees half a file


class LocalBackend:
    """A process pool kept open across batches (`workers` = 1 runs in this process)."""

    def __init__(self, workers: int | None = None):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._pool: ProcessPoolExecutor | None = None

    def map(self, jobs: list[Job], done: Callable[[Job, Outcome], None]) -> list[Outcome]:
        if self.workers == 1 or len(jobs) == 1:
            outs = []
            for j in jobs:
                outs.append(run_job(j))
                done(j, outs[-1])
            return outs
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers)
        futures = [self._pool.submit(run_job, j) for j in jobs]
        outs = []
        for j, f in zip(jobs, futures):
            outs.append(f.result())
            done(j, outs[-1])
        return outs

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


class Backend(Protocol):
    """Where jobs run: LocalBackend here, provision/ray_backend.py's RayBackend on a Ray cluster."""

    workers: int

    def map(self, jobs: list[Job], done: Callable[[Job, Outcome], None]) -> list[Outcome]: ...

    def close(self) -> None: ...


@dataclass
class Evaluator:
    """Answers jobs from the cache or the backend; counts what it did. `perf_model` other than
    "auto": every job runs with that step-time model (simulate --perf-model)."""
    backend: Backend
    cache: Cache | None = None
    on_done: Callable[[Job, Outcome, bool], None] | None = None   # (job, outcome, from_cache)
    perf_model: str = "auto"
    simulated: int = 0
    cached: int = 0
    sim_wall_s: float = 0.0
    results: dict[Job, Outcome] = field(default_factory=dict)

    @property
    def width(self) -> int:
        return self.backend.workers

    def __post_init__(self) -> None:
        check_perf_model(self.perf_model)

    def __call__(self, jobs: list[Job]) -> list[Outcome]:
        if self.perf_model != "auto":
            jobs = [replace(j, perf_model=self.perf_model) for j in jobs]
        todo = []
        for j in dict.fromkeys(jobs):
            if j in self.results:
                continue
            hit = self.cache.get(j) if self.cache else None
            if hit is not None:
                self.cached += 1
                self.results[j] = hit
                if self.on_done:
                    self.on_done(j, hit, True)
            else:
                todo.append(j)
        if todo:
            self.backend.map(todo, self._done)
        return [self.results[j] for j in jobs]

    def _done(self, job: Job, out: Outcome) -> None:
        self.simulated += 1
        self.sim_wall_s += out.wall_s
        self.results[job] = out
        if self.cache:
            self.cache.put(job, out)
        if self.on_done:
            self.on_done(job, out, False)

    def close(self) -> None:
        self.backend.close()
