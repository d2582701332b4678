"""The cluster-level schedulers by name (`--cluster-scheduler`, RoutingConfig.cluster_scheduler):
the simulator and the live router both build theirs here."""

from __future__ import annotations

from collections.abc import Callable

from .aladdin import AladdinScheduler
from .cluster import ClusterScheduler, RoutingConfig
from .instance_flip import InstanceFlipScheduler
from .pools import JSQScheduler, SplitwiseScheduler
from .state import Machine


def _splitwise(machines: list[Machine], cfg: RoutingConfig, split: bool) -> ClusterScheduler:
    if not split:
        raise ValueError("the splitwise cluster scheduler needs a design with prompt and token pools")
    return SplitwiseScheduler(machines, cfg)


def _tetriinfer(machines: list[Machine], cfg: RoutingConfig, split: bool) -> ClusterScheduler:
    if not split:
        raise ValueError("the tetriinfer cluster scheduler needs a design with prompt and token pools")
    return InstanceFlipScheduler(machines, cfg)


def _aladdin(machines: list[Machine], cfg: RoutingConfig, split: bool) -> ClusterScheduler:
    return AladdinScheduler(machines, cfg, split)


# cluster-level schedulers by name (--cluster-scheduler): (machines, routing, split) -> scheduler
CLUSTER_SCHEDULERS: dict[str, Callable[[list[Machine], RoutingConfig, bool], ClusterScheduler]] = {
    "splitwise": _splitwise,
    "jsq": lambda machines, cfg, split: JSQScheduler(machines, cfg.prefix_slack),
    "aladdin": _aladdin,
    "tetriinfer": _tetriinfer,
}


def make_cluster_scheduler(machines: list[Machine], cfg: RoutingConfig, split: bool) -> ClusterScheduler:
    """The cluster scheduler the routing config names; `auto`: Splitwise's for a design with prompt
    and token pools (`split`), JSQ over mixed machines otherwise. The simulator and the live router
    both build theirs here."""
    name = cfg.cluster_scheduler if cfg.cluster_scheduler != "auto" else ("splitwise" if split else "jsq")
    return CLUSTER_SCHEDULERS[name](machines, cfg, split)
