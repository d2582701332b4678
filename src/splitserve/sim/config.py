"""What one simulation is set up with besides its cluster, model and workload (`SimConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import Catalog
from ..policy.config import PolicyConfig
from ..report.goodput import GoodputSLO
from .chrome_trace import ChromeTrace
from .hosts import Hosts


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    policy: PolicyConfig = PolicyConfig()    # the scheduling policies' settings (as `serve` runs them)
    memory_utilization: float = 0.9
    profile: str | None = None               # profile CSV; the catalog's model where it has no rows
    perf_model: str = "auto"                 # where no profile row applies: auto, operators or roofline
    decode_lookup: str = "batch-size"        # how decode times are read (perf/decode_lookup.py)
    record_requests: bool = False            # keep every Request with its token times
    machine: Hosts | None = None             # what the machines are (sim/hosts.py): a measured machine
                                             # (twin.machine.MachineProfile); None: the catalog's
    trace: ChromeTrace | None = None         # every batch and transfer, for chrome://tracing
    goodput: GoodputSLO | None = None        # count the requests meeting it
    colocated: bool = False                  # prompt and token instances share nodes: KV over NVLink
    catalog: Catalog | None = None           # machine kinds and KV-transfer overheads (None: built-in)
    prefix_caching: bool = True              # model each machine's prefix cache (a workload with prompts)
    block_size: int = 16                     # KV block tokens of the prefix caches (sim/prefix.py)
