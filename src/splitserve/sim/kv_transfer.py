"""When a request's KV cache has reached its token machine (paper §IV-C, Fig. 11).

Serialized: the whole cache leaves after the prompt batch ends, behind whatever the prompt
machine's link is still sending. Layer-wise: layer i's KV is ready at start + (i+1)*D/L and goes
out at once, so the link pipelines with the computation; only the tail after the prompt ends is
visible (the "non-overlapped" part). Both pay a fixed synchronisation overhead (the semaphore the
token machine waits on). Only the non-overlapped part delays the token phase.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import Catalog, HardwareSpec, builtin_catalog


@dataclass(frozen=True, slots=True)
class Link:
    bandwidth: float        # bytes/s between the two machines
    overhead: float         # seconds of fixed synchronisation per transfer


def serialized_done(link: Link, nbytes: float, ready: float) -> float:
    """Transfer that may start at `ready` (prompt end, or link free): when it completes."""
    return ready + nbytes / link.bandwidth + link.overhead


def layerwise_done(link: Link, nbytes: float, layers: int, start: float, end: float) -> float:
    """Per-layer transfers overlapped with a prompt batch running from `start` to `end`."""
    per_layer_compute = (end - start) / layers
    per_layer_send = nbytes / layers / link.bandwidth
    if per_layer_send <= per_layer_compute:          # the link keeps up: only the last layer shows
        done = end + per_layer_send
    else:                                            # the link is the bottleneck
        done = start + per_layer_compute + layers * per_layer_send
    return done + link.overhead


def link_between(src: HardwareSpec, dst: HardwareSpec, colocated: bool = False,
                 catalog: Catalog | None = None) -> Link:
    """The link a KV transfer from machine kind `src` to `dst` (HardwareSpecs) gets: the machines'
    network (`ib_gbs`), or with `colocated` (the prompt and token instances share a node, as
    DistServe's low node-affinity placement puts them, provision/placement/) one GPU's NVLink,
    one way (`link_bytes_per_s`, half of `nvlink_gbs`). The fixed overheads are `catalog`'s
    (kv_transfer.toml; default: the built-in catalog's); a machine without one has none."""
    overheads = (catalog or builtin_catalog()).kv_overhead_s
    bandwidth = (min(src.link_bytes_per_s, dst.link_bytes_per_s) if colocated
                 else min(src.ib_bytes_per_s, dst.ib_bytes_per_s))
    return Link(bandwidth=bandwidth,
                overhead=max(overheads.get(src.name, 0.0), overheads.get(dst.name, 0.0)))

