"""Provisioning's simulations spread over a Ray cluster: `RayBackend`, the backend the Evaluator
(provision/evaluate.py) sends jobs to with `--backend ray`, and the task each node runs."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..nodes.ray_cluster import check_nodes, connect
from ..workload.synthetic import SYNTHETIC
from .evaluate import Job, Outcome, run_job


class RayBackend:
    """Spreads simulations over a Ray cluster (`address` None or "local": a new local instance).

    Before any simulation, every node must run this host's splitserve (ray_cluster.check_nodes).
    The files a job names (its `--profile` CSV, a trace workload) are read here, once, and
    shipped in Ray's object store; a task writes them into its node's temporary directory (one
    copy per content) and runs the job on that copy, so no node needs this host's paths. Tasks
    go out with the SPREAD strategy; `nodes` counts the simulations each node ran."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None):
        self._owned = connect(address, num_cpus=num_cpus, runtime_env={"env_vars": {"PYTHONWARNINGS": "ignore"}})
        import ray

        self._ray = ray
        try:
            check_nodes()
        except BaseException:
            self.close()
            raise
        self.workers = int(ray.cluster_resources().get("CPU", 1))
        self._remote = ray.remote(run_shipped).options(scheduling_strategy="SPREAD")
        self._shipped: dict[str, object] = {}   # path here -> ObjectRef of (file name, bytes)
        self.nodes: dict[str, int] = {}         # Ray node id -> simulations run there

    def _files(self, job: Job) -> tuple[tuple[str, ...], list]:
        """The job's fields that name files here, and their shipped contents."""
        fields, refs = [], []
        for name in shipped_fields(job):
            path = str(Path(getattr(job, name)).resolve())
            if path not in self._shipped:
                self._shipped[path] = self._ray.put((Path(path).name, Path(path).read_bytes()))
            fields.append(name)
            refs.append(self._shipped[path])
        return tuple(fields), refs

    def map(self, jobs: list[Job], done: Callable[[Job, Outcome], None]) -> list[Outcome]:
        refs = []
        for j in jobs:
            fields, blobs = self._files(j)
            refs.append(self._remote.remote(j, fields, *blobs))
        index = {r: i for i, r in enumerate(refs)}
        outs: dict[int, Outcome] = {}   # job index -> its outcome, as they finish
        pending = list(refs)
        while pending:
            ready, pending = self._ray.wait(pending, num_returns=1)
            for r in ready:
                i = index[r]
                node, outs[i] = self._ray.get(r)
                self.nodes[node] = self.nodes.get(node, 0) + 1
                done(jobs[i], outs[i])
        return [outs[i] for i in range(len(jobs))]

    def close(self) -> None:
        if self._owned:
            self._ray.shutdown()
            self._owned = False


def shipped_fields(job: Job) -> list[str]:
    """The fields of `job` that name a file to ship: its profile, and its workload when that is a
    trace file rather than a synthetic workload's name."""
    out = ["profile"] if job.profile else []
    if job.workload not in SYNTHETIC and Path(job.workload).is_file():
        out.append("workload")
    return out


def run_shipped(job: Job, fields: tuple[str, ...], *files: tuple[str, bytes]) -> tuple[str, Outcome]:
    """A Ray task: `files` (name, bytes) written into this node's temporary directory, in a folder
    named by their hash, the job's `fields` pointed at those copies, the job run. Returns (this
    node's id, the outcome)."""
    import ray    # on the node: Ray is there

    paths: dict[str, Any] = {}   # Job field -> the path of its file here
    for name, (fname, data) in zip(fields, files):
        folder = Path(tempfile.gettempdir()) / "splitserve-shipped" / hashlib.sha256(data).hexdigest()[:24]
        path = folder / fname
        if not path.is_file() or path.stat().st_size != len(data):
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{fname}.{os.getpid()}.tmp"
            tmp.write_bytes(data)
            tmp.replace(path)              # atomic: a task beside it never reads half a file
        paths[name] = str(path)
    return ray.get_runtime_context().get_node_id(), run_job(replace(job, **paths))
