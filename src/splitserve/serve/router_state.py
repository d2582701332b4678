"""What the router's parts share, typed in one place (router.py: the Router owns one `RouterState`
and hands it to each part: RequestFlow, Recovery, ReportReader, RouterWatch, RouterViews)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .channel import RouterChannel
from .cluster_state import LiveCluster
from .config import ServeConfig
from .metrics import ServeMetrics
from .requests import RequestTable
from .supervisor import Supervisor, WorkerInfo


@dataclass(eq=False)
class RouterState:
    """The router's state. `workers`, `sup` and `cluster` are set once by `Router.start` (before it,
    `workers` are the configured slots, `sup` and `cluster` None); the lifecycle flags are the
    Router's to set, the parts only read them. `reqs` is the one table every part changes."""

    cfg: ServeConfig
    metrics: ServeMetrics
    chan: RouterChannel
    boot: str | None                # workers of the same boot share the router's clock (reports.py)
    workers: list[WorkerInfo]
    reqs: RequestTable = field(default_factory=RequestTable)
    sup: Supervisor | None = None
    cluster: LiveCluster | None = None
    ready: bool = False             # started: every worker said hello
    draining: bool = False          # shutdown began: admit nothing new
    closing: bool = False           # stopping: the workers are told to stop

    @property
    def supervisor(self) -> Supervisor:
        """`sup`, for the parts that run only once `Router.start` made it (launches, hellos, the monitor)."""
        sup = self.sup
        assert sup is not None, "the router has not started"
        return sup

    @property
    def policy_view(self) -> LiveCluster:
        """`cluster`, for the parts that run only once `Router.start` made it: routing, and every
        report about a request (no request is admitted before)."""
        cluster = self.cluster
        assert cluster is not None, "the router has not started"
        return cluster
