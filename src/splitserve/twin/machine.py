"""A machine measured by `splitserve profile`, as the simulator uses it: the perf model fitted to
its profile.csv (perf/profile.py, the same fit as the Splitwise authors' profile), its KV capacity
in tokens, the KV link of a transport, and the model's shape. `simulate --machine-profile DIR`
and `splitserve twin` simulate clusters of such machines: `MachineProfile` is what the simulator
runs on (sim/hosts.py Hosts), and `HostStep` (twin/host_step.py) times its workers' steps (perf/step.py
StepModel) as the live host runs them, by its `timing` (twin/worker_timing.py WorkerTiming)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..catalog import ModelSpec
from ..cluster.designs import ClusterSpec, Design
from ..cluster.instance import Instance
from ..errors import UserError
from ..perf.profile import ProfilePerfModel, read_profile_rows
from ..policy.state import Machine, Pool
from ..sim.kv_transfer import Link, serialized_done
from .host_step import HostStep
from .worker_timing import WorkerTiming


TERMS = ("corun", "kv_transfer", "path")   # what `MachineProfile.without` can take out


class NoPower:
    """Power is not measured on this machine: every figure is 0 W."""

    def prompt_power_w(self, tokens: int) -> float:
        return 0.0

    def token_power_w(self, batch: int) -> float:
        return 0.0

    def idle_power_w(self) -> float:
        return 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineProfile:
    """A measured machine as the simulator runs on it (sim/hosts.py Hosts, sim/run.py
    MeasuredMachine): its profile's `facts`, perf model, model and KV link, at a load
    (`under_load`) and a speed (`drift`). The timing of its workers' steps on the cores they share
    is its part `timing` (twin/worker_timing.py WorkerTiming), made from `facts`, `drift` and
    `background_cores` whenever a profile is (`under_load`, `without`, dataclasses.replace)."""

    name: str
    facts: dict
    perf: ProfilePerfModel
    model: ModelSpec
    link: Link
    transport: str
    power: NoPower = NoPower()
    cost_per_hour: float = 0.0   # not a catalog machine: no price, no provisioned power
    power_kw: float = 0.0
    background_cores: float = 0.0  # cores the serving path and the client take at the run's load (under_load)
    send_link: Link | None = None  # the sender's part of `link` (None: a profile that did not time it)
    drift: tuple[float, float] = (1.0, 1.0)  # (prompt, decode) steps' speed now / profiled (steps.run_speed)
    pinned: bool = False  # the workers run pinned to cores (serve --pin-workers): time-sharing per core
    spread: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())  # (prompt, decode) factors of a step's work
    reserves_between_steps = True  # serve's token worker answers a reservation between steps (sim/reservation.py)
    timing: WorkerTiming = field(init=False, repr=False, compare=False)  # its workers' steps, from the fields above

    def __post_init__(self) -> None:
        object.__setattr__(self, "timing", WorkerTiming(facts=self.facts, drift=self.drift,
                                                        background_cores=self.background_cores))

    @property
    def kv_capacity(self) -> int:
        return int(self.facts["kv_capacity_tokens"])

    @property
    def request_overhead(self) -> float:
        """Seconds the serving path adds to each request's first token, once (twin/path.py)."""
        return float(self.facts.get("path", {}).get("request_overhead_s", 0.0))

    @property
    def background_s(self) -> float:
        """CPU seconds a request costs the serving path and the client outside engine steps (path.py)."""
        return float(self.facts.get("path", {}).get("background_cpu_s", 0.0))

    def transfer_s(self, prompt_tokens: float) -> float:
        """CPU seconds of a KV transfer of `prompt_tokens` (both ends copy and sign it): the link's time."""
        return serialized_done(self.link, prompt_tokens * self.model.kv_bytes_per_token, 0.0)

    def send_s(self, prompt_tokens: float) -> float:
        """CPU seconds the sending worker spends on a KV transfer of `prompt_tokens`, inside its
        engine step (serve's prompt worker signs and hands over its KV in the step that ends the
        prompt); 0 where the profile did not time the sender."""
        link = self.send_link
        return 0.0 if link is None else serialized_done(link, prompt_tokens * self.model.kv_bytes_per_token, 0.0)

    def under_load(self, rate: float, moved_tokens: float = 0.0) -> "MachineProfile":
        """This machine serving `rate` requests/s, each moving `moved_tokens` of KV between
        workers on average (a split design; 0 unsplit): the cores the serving path, the client
        and the transfers take from the workers. The sender's part of a transfer is not among
        them: it is in the prompt worker's step (WorkerTiming.work_s's `sent_s`)."""
        moved = max(0.0, self.transfer_s(moved_tokens) - self.send_s(moved_tokens)) if moved_tokens > 0 else 0.0
        return dataclasses.replace(self, background_cores=max(0.0, rate) * (self.background_s + moved))

    def without(self, term: str) -> "MachineProfile":
        """This machine with one modelled term taken out (a twin's negative control, TERMS): `corun`
        the slowdown of a worker next to busy ones (measured co-run and time-sharing of the cores),
        `kv_transfer` the KV link's time (transfers take none), `path` the serving path (step and
        request overheads, its CPU)."""
        if term == "corun":
            return dataclasses.replace(self, facts={**self.facts, "corun": {"prompt": 0.0, "token": 0.0},
                                                    "time_sharing": False})
        if term == "kv_transfer":
            free = Link(bandwidth=float("inf"), overhead=0.0)
            return dataclasses.replace(self, link=free, send_link=None)
        if term == "path":
            return dataclasses.replace(self, facts={**self.facts, "path": {}}, background_cores=0.0)
        raise UserError(f"unknown term {term!r}; one of {', '.join(TERMS)}")

    # ---- what the simulator runs on (sim/hosts.py Hosts) ---------------------------------------
    @property
    def reference(self) -> ProfilePerfModel:
        """SLO slowdowns against the same request alone on this machine."""
        return self.perf

    def instance(self, inst: Instance, machines: list[Machine]) -> tuple["MachineProfile", HostStep]:
        """Every instance is this machine; its workers share the host with `machines`."""
        return self, HostStep(self, machines)

    def kv_link(self, src: str, dst: str) -> Link:
        """The link a KV hand-over takes once its prompt's step ended: the measured link (from the
        sender's first byte to the receiver's last) less the sender's part, which is in the step
        (send_s); the whole link where the profile did not time the sender."""
        if self.send_link is None:
            return self.link
        per_byte = 1.0 / self.link.bandwidth - 1.0 / self.send_link.bandwidth
        return Link(bandwidth=1.0 / per_byte if per_byte > 0 else float("inf"),
                    overhead=max(0.0, self.link.overhead - self.send_link.overhead))

    def cluster(self, design: str, *, prompt: int = 1, token: int = 1, machines: int = 2) -> ClusterSpec:
        """Splitwise with `prompt` + `token` machines, or the unsplit baseline with `machines`."""
        if design == "splitwise":
            d = Design(name="splitwise", scheduler="splitwise", prompt=self.name, token=self.name,
                       description=f"Splitwise on {self.name}")
            one = Instance(self.name, tp=1)
            return ClusterSpec(d, ((one, Pool.PROMPT, prompt), (one, Pool.TOKEN, token)))
        if design == "baseline":
            d = Design(name="baseline", scheduler="mixed", machine=self.name, description=f"unsplit on {self.name}")
            return ClusterSpec(d, ((Instance(self.name, tp=1), Pool.MIXED, machines),))
        raise UserError(f"design must be splitwise or baseline on a measured machine, got {design!r}")


def load_machine_profile(path: str | Path, transport: str = "tcp") -> MachineProfile:
    """The machine `splitserve profile --out path` measured (UserError if it is incomplete)."""
    path = Path(path)
    try:
        facts = json.loads((path / "machine.json").read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path}/machine.json: {e}; run `splitserve profile --out {path}` first") from None
    rows = read_profile_rows(path / "profile.csv", facts["model"], facts["name"], 1)
    if not rows:
        raise UserError(f"{path}/profile.csv has no rows for {facts['model']} on {facts['name']}")
    if transport not in facts["links"]:
        raise UserError(f"{path} has no measured link for transport {transport!r}")
    lk = facts["links"][transport]
    c = facts["model_config"]
    layers, kv_heads, head_dim = c["num_layers"], c["num_kv_heads"], c["head_dim"]
    model = ModelSpec(name=facts["model"], layers=layers, hidden=c["hidden_size"], heads=c["num_heads"],
                      kv_heads=kv_heads, head_dim=head_dim, intermediate=c["intermediate_size"],
                      vocab=c["vocab_size"], params=0, max_context=facts["max_model_len"],
                      dtype_bytes=facts["kv_bytes_per_token"] // (2 * layers * kv_heads * head_dim))
    perf = ProfilePerfModel.from_rows(rows, source=f"profile:{path}/profile.csv", attention=True)
    perf.additive = mixed_rule(perf, facts.get("mixed", [])) == "add"
    sender = lk.get("sender")  # profiles before the sender was timed have none
    return MachineProfile(name=facts["name"], facts=facts, transport=transport, model=model, perf=perf,
                          link=Link(bandwidth=lk["bandwidth_bytes_per_s"], overhead=lk["fixed_s"]),
                          send_link=None if sender is None else Link(bandwidth=sender["bandwidth_bytes_per_s"],
                                                                     overhead=sender["fixed_s"]))


def mixed_rule(perf: ProfilePerfModel, points: list[dict]) -> str:
    """"add" or "max" (perf/mixed.py), whichever fits the measured mixed steps better (mean
    absolute relative error); "max", the paper's rule, without measurements."""
    def err(additive: bool) -> float:
        perf.additive = additive
        return sum(abs(perf.mixed_time(q["prompt"], q["decodes"], q["context"], q["prompt"] ** 2) * 1e3 / q["ms"] - 1)
                   for q in points)
    try:
        return "add" if points and err(True) < err(False) else "max"
    finally:
        perf.additive = False
