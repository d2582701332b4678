"""prometheus_client as splitserve uses it: a registry's series without `_created` (NoCreated), a
series under a second name (Alias), labelled children looked up once (Children), and the bucket
ladders of the latency and token-count histograms."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric


class Children:
    """A labelled metric whose children are looked up once each: prometheus_client's `labels()`
    takes a lock and re-checks the label values on every call (about 3 us, several times per
    request). Everything else is the metric's own."""

    __slots__ = ("_metric", "_children")

    def __init__(self, metric: MetricWrapperBase) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        try:
            return self._children[values]
        except KeyError:
            child = self._children[values] = self._metric.labels(*values)
            return child

    def __getattr__(self, name: str) -> Any:
        return getattr(self._metric, name)


class NoCreated:
    """A registry's metrics without their `_created` samples. prometheus_client (0.26) turns them
    off only process-wide (`disable_created_metrics()`, or PROMETHEUS_DISABLE_CREATED_SERIES read
    at import); its per-registry `restricted_registry` (experimental) keeps listed sample names
    and yields its collectors in set order. This keeps every sample but `_created`, in order."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self):
        for m in self.registry.collect():
            out = Metric(m.name, m.documentation, m.type, m.unit)
            out.samples = [s for s in m.samples if not s.name.endswith("_created")]
            yield out


class Alias:
    """A metric of the registry under another name, with constant labels added: the same samples,
    so one observation serves both names (a token's gap is observed once, not three times)."""

    def __init__(self, source, name: str, documentation: str, labels: dict[str, str]) -> None:
        self.source, self.name, self.documentation, self.labels = source, name, documentation, labels

    def collect(self):
        for m in self.source.collect():
            out = Metric(self.name, self.documentation, m.type)
            out.samples = [s._replace(name=self.name + s.name[len(m.name):], labels={**s.labels, **self.labels})
                           for s in m.samples]
            yield out


def one_two_five(top: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to `top` (vLLM's buckets for token counts)."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > top:
                return out
            out.append(float(m * scale))
        scale *= 10


LAT = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
GAP = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
REQ = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
        120.0, 240.0, 480.0, 960.0)
ITER = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
