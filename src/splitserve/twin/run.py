"""`splitserve twin`: run the live cluster and the simulator on the same requests, side by side.

1. start `splitserve serve` with the design's workers (engine workers, the profile's model and
   KV blocks, one torch thread each, the given policy), on a free port;
2. replay the workload against it with `splitserve bench` (a separate process, as a client is);
3. simulate the same requests (same workload, seed, rate, duration and caps, so the same arrival
   times and sizes) on a cluster of the measured machine (machine.py), same design and policy;
4. compare (report.py) and write out/report.md, out/cdf.png, out/twin.json, with the live run's
   summary.json / requests.jsonl in out/live and the simulator's summary.json in out/sim.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from ..errors import UserError
from ..policy.config import PolicyConfig, cli_args
from .machine import MachineProfile

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class TwinSpec:
    design: str = "splitwise"        # splitwise (prompt + token workers) or baseline (mixed workers)
    prompt: int = 1
    token: int = 1
    machines: int = 2
    workload: str = "coding"
    rps: float = 1.0
    duration: float = 60.0
    seed: int = 0
    max_prompt_tokens: int | None = None
    max_tokens_cap: int | None = None
    transport: str = "tcp"
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    conversation: str | None = None  # multiturn / sysprompt: their shape (workload/conversations.py)
    prefix_caching: bool = True      # conversations: both runs keep prefix caches (else neither)
    pin_workers: bool = True         # serve --pin-workers, and the simulated host shares cores per core

    @property
    def shares_prefixes(self) -> bool:
        """A workload of conversations: both runs keep prefix caches (uncapped: the shape sizes them)."""
        from ..workload.conversations import SHAPES
        return self.workload in SHAPES

    def workers(self) -> str:
        return f"{self.prompt}P+{self.token}T" if self.design == "splitwise" else f"{self.machines} mixed"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(spec: TwinSpec, machine: MachineProfile, port: int, step_log: Path | None = None) -> list[str]:
    f = machine.facts
    cmd = [sys.executable, "-m", "splitserve.cli", "serve", "--model", f["model"], "--port", str(port),
           "--device", f["device"], "--dtype", f["dtype"], "--num-blocks", str(f["num_blocks"]),
           "--worker-threads", str(f["how"]["threads_per_worker"]), "--transport", spec.transport]
    if not (spec.shares_prefixes and spec.prefix_caching):  # nothing to share: compute as the profile measured it
        cmd.append("--no-prefix-caching")
    if step_log is not None:
        cmd += ["--step-log", str(step_log)]
    if spec.pin_workers:
        cmd.append("--pin-workers")
    if spec.design == "splitwise":
        cmd += ["--prompt-workers", str(spec.prompt), "--token-workers", str(spec.token)]
    else:
        cmd += ["--design", "baseline", "--mixed-workers", str(spec.machines)]
    return cmd + cli_args(spec.policy)


def bench_command(spec: TwinSpec, url: str, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "splitserve.cli", "bench", "--url", url, "--rps", str(spec.rps),
           "--duration", str(spec.duration), "--workload", spec.workload, "--seed", str(spec.seed),
           "--out", str(out), "--quiet"]
    if spec.shares_prefixes:
        return cmd + (["--conversation", spec.conversation] if spec.conversation else [])
    if spec.max_prompt_tokens is not None:
        cmd += ["--max-prompt-tokens", str(spec.max_prompt_tokens)]
    if spec.max_tokens_cap is not None:
        cmd += ["--max-tokens-cap", str(spec.max_tokens_cap)]
    return cmd


@contextmanager
def serving(spec: TwinSpec, machine, out: Path):
    """A `splitserve serve` of `spec` on a free port, healthy: (its URL, its process id); stopped
    on exit. Its log: out/serve.log; its workers' engine steps:
    out/steps/ (steps.py)."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    out.mkdir(parents=True, exist_ok=True)
    for old in (out / "steps").glob("worker-*.jsonl"):  # the workers append
        old.unlink()
    with (out / "serve.log").open("w") as serve_log:
        srv = subprocess.Popen(serve_command(spec, machine, port, out / "steps"), stdout=serve_log, stderr=subprocess.STDOUT,
                               start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while True:
                if srv.poll() is not None:
                    raise UserError(f"splitserve serve exited ({srv.returncode}); see {out}/serve.log")
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise UserError(f"splitserve serve was not healthy within 180 s; see {out}/serve.log")
                time.sleep(0.5)
            yield url, srv.pid
        finally:
            os.killpg(srv.pid, signal.SIGTERM)
            try:
                srv.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(srv.pid, signal.SIGKILL)


def run_live(spec: TwinSpec, machine: MachineProfile, out: Path, log: Callable[[str], None] | None = None,
             calibrate: Callable[[str], None] | None = None) -> dict:
    """Serve, bench, stop; the bench's summary.json (plus the server's counters under "server").
    `calibrate(url)`, if given, runs against the server right before the bench and right after it;
    the summary's "calibration" holds their windows ("before", "after": [start, end], wall-clock
    seconds as the step logs' "t"), and the counters leave out what they sent."""
    windows: dict[str, list[float]] = {}
    log = log or logger.info
    with serving(spec, machine, out) as (url, _):
        if calibrate is not None:
            windows["before"] = _timed(calibrate, url)
        start = server_counters(httpx.get(url + "/metrics", timeout=10).text)
        log(f"live: {spec.workers()} at {url}; replaying {spec.duration:g} s of {spec.workload} at {spec.rps:g} req/s")
        done = subprocess.run(bench_command(spec, url, out), capture_output=True, text=True)
        if done.returncode != 0:
            raise UserError(f"splitserve bench failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        end = server_counters(httpx.get(url + "/metrics", timeout=10).text)
        if calibrate is not None:
            windows["after"] = _timed(calibrate, url)
    summary = json.loads((out / "summary.json").read_text())
    summary["server"] = {k: v - start.get(k, 0.0) for k, v in end.items()}
    summary.setdefault("cluster", {}).update(preemptions=int(summary["server"].get("preemptions", 0)),
                                             borrowed_into_mixed_pool=int(summary["server"].get("borrowed", 0)))
    if windows:
        summary["calibration"] = windows
    return summary


def _timed(run: Callable[[str], None], url: str) -> list[float]:
    t0 = time.time()
    run(url)
    return [t0, time.time()]


def server_counters(text: str) -> dict:
    """Totals from the server's Prometheus text: preemptions, restarts, KV transfers and their time,
    machines borrowed into the mixed pool."""
    want = {"splitserve_kv_transfers_total": "kv_transfers", "splitserve_kv_transfer_seconds_total": "kv_transfer_s",
            "splitserve_kv_transfer_exposed_seconds_total": "kv_transfer_exposed_s",
            "splitserve_request_restarts_total": "restarts", "vllm:num_preemptions_total": "preemptions",
            "splitserve_machines_borrowed_total": "borrowed"}
    got: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in want:
            got[want[name]] = got.get(want[name], 0.0) + float(line.rsplit(" ", 1)[1])
    return got


@dataclass(frozen=True, slots=True)
class _Req:
    arrival: float
    prompt_tokens: int
    output_tokens: int


def planned(spec: TwinSpec) -> list[_Req]:
    """The requests the bench sends for `spec` (same workload, seed, rate, duration and caps;
    conversations: their first turns, the later ones follow their replies)."""
    from ..bench.plan import Caps, plan_requests
    from ..workload import make_workload
    from ..workload.conversations import Conversations

    wl = make_workload(spec.workload, rps=spec.rps, duration=spec.duration, seed=spec.seed,
                       conversation=spec.conversation)
    if isinstance(wl, Conversations):  # spec.shares_prefixes
        return [_Req(r.arrival, r.prompt_tokens, r.output_tokens) for r in wl]
    caps = Caps(spec.max_prompt_tokens, spec.max_tokens_cap)
    return [_Req(r.arrival, r.prompt_tokens, r.max_tokens) for r in plan_requests(wl, caps)]


def loaded(spec: TwinSpec, machine: MachineProfile, reqs: list[_Req], served_rps: float | None = None):
    """`machine` with the background load (machine.under_load) of `served_rps` requests/s, by
    default the arrival rate (a split design moves each request's prompt KV once), its workers
    pinned to cores as `spec` runs them."""
    moved = sum(r.prompt_tokens for r in reqs) / len(reqs) if reqs and spec.design == "splitwise" else 0.0
    under = machine.under_load(spec.rps if served_rps is None else served_rps, moved)
    return dataclasses.replace(under, pinned=spec.pin_workers)


def simulate(spec: TwinSpec, machine: MachineProfile, served_rps: float | None = None):
    """(the simulation's result, its workload, the machine as loaded) of the simulator on the
    requests the bench sent, on the machine under that load (`loaded`)."""
    from ..sim.config import SimConfig
    from ..sim.simulator import Simulation
    from ..workload import make_workload

    wl = make_workload(spec.workload, rps=spec.rps, duration=spec.duration, seed=spec.seed,
                       conversation=spec.conversation)
    reqs = planned(spec)
    cluster = machine.cluster(spec.design, prompt=spec.prompt, token=spec.token, machines=spec.machines)
    machine = loaded(spec, machine, reqs, served_rps)
    sim = Simulation(cluster, machine.model, wl if spec.shares_prefixes else reqs,
                     SimConfig(policy=spec.policy, machine=machine, record_requests=True,
                               prefix_caching=spec.prefix_caching))
    return sim.run(), wl, machine


def run_sim(spec: TwinSpec, machine: MachineProfile, served_rps: float | None = None):
    """(summary, per-request samples) of the simulator on the requests the bench sent (`simulate`)."""
    from ..report.summary import simulation_summary

    result, wl, machine = simulate(spec, machine, served_rps)
    samples: dict[str, list[float]] = {"ttft": [], "tbt": [], "e2e": []}
    for r in result.requests:
        times = r.token_times or []
        if not times:
            continue
        samples["ttft"].append(times[0] - r.arrival + machine.request_overhead)
        samples["e2e"].append(times[-1] - r.arrival + machine.request_overhead)
        if len(times) > 1:  # per-request mean gap, once per gap: as report.samples_from_requests_jsonl
            gap = (times[-1] - times[0]) / (len(times) - 1)
            samples["tbt"] += [gap] * (len(times) - 1)
    return simulation_summary(result, wl), samples


def spec_dict(spec: TwinSpec) -> dict:
    d = asdict(spec)
    d["policy"] = json.loads(spec.policy.to_json())
    return d


def spec_from_dict(d: dict) -> TwinSpec:
    """The TwinSpec that spec_dict wrote."""
    return TwinSpec(**{**d, "policy": PolicyConfig.from_json(json.dumps(d["policy"]))})


def predicted_capacity(spec: TwinSpec, machine: MachineProfile) -> float:
    """The throughput (req/s) the simulated cluster reaches when arrivals outrun it: its capacity
    on this workload, as the profile predicts it (with the host's background load at that
    throughput: three rounds from none)."""
    from dataclasses import replace

    hot = replace(spec, rps=50.0, duration=min(spec.duration, 60.0))
    served = 0.0  # the background load is that of the requests served: iterate to the fixed point
    for _ in range(3):
        summary, _ = run_sim(hot, machine, served_rps=served)
        served = float(summary["throughput_rps"])
    return served
