"""The simulator's KV hand-over (paper §IV-C): a prefilled request's KV goes from its prompt
machine to its token machine over the link between their kinds, serialized behind the prompt
machine's earlier transfers or layer by layer under the batch that made it (sim/kv_transfer.py);
its landing is a TRANSFER_END event (the simulation then frees the prompt machine's copy and
admits what waited for memory: sim/simulator.py)."""

from __future__ import annotations

from ..catalog import ModelSpec
from ..policy.cluster import pull_kv
from ..policy.kv_transfer import TransferMode, choose_mode
from ..policy.machine import Batch
from ..policy.prefix_cache import cached_tokens
from ..policy.state import Machine, Request
from .chrome_trace import ChromeTrace
from .events import TRANSFER_END
from .hosts import Hosts
from .kv_transfer import Link, layerwise_done, serialized_done
from .state import Layerwise, SimState


class KVHandoff:
    """The links between machine kinds (made when first used) and when each machine's outgoing
    link is free; the model's KV bytes per token and layers; the prefix caches' block size; the
    prompt tokens of a batch from which its prompts' KV streams layer by layer."""

    def __init__(self, state: SimState, hosts: Hosts, trace: ChromeTrace | None, model: ModelSpec, block: int,
                 layerwise_threshold: int) -> None:
        self.state = state
        self.hosts = hosts
        self.trace = trace
        self.kv_bytes: int = model.kv_bytes_per_token
        self.layers: int = model.layers
        self.block = block
        self.layerwise_threshold = layerwise_threshold
        self.links: dict[tuple[str, str], Link] = {}
        self.links_out: list[float] = [0.0] * len(state.machines)

    def link(self, src: Machine, dst: Machine) -> Link:
        key = (src.hardware, dst.hardware)
        link = self.links.get(key)
        if link is None:
            link = self.links[key] = self.hosts.kv_link(src.hardware, dst.hardware)
        return link

    def streamed(self, mid: int, batch: Batch) -> Layerwise:
        """The prompts of `batch`, starting on machine `mid`, whose KV streams to their token
        machines layer by layer while the batch runs (a large batch: policy/kv_transfer.py; their
        prefill ends in it, and their KV there is reserved), or ()."""
        if choose_mode(batch.prompt_tokens, self.layerwise_threshold) is not TransferMode.LAYERWISE:
            return ()
        layerwise: Layerwise = ()
        for r, n in zip(batch.prompts, batch.chunks):
            if r.token_machine != mid and r.prefilled + n == r.prefill_len and r.kv_on_token_machine:
                if not isinstance(layerwise, list):
                    layerwise = []
                layerwise.append(r)
        return layerwise

    def skipped(self, t: Machine, r: Request) -> int:
        """Prompt tokens of `r` that token machine `t`'s prefix cache holds (sim/prefix.py), as its
        reservation finds them: not sent."""
        if r.blocks is None or t.cache is None:
            return 0
        skip = cached_tokens(t.cache, r.blocks, r.prompt_tokens, self.block)
        self.state.metrics.transfer_skipped += skip
        return skip

    def send(self, p: Machine, r: Request, start: float, end: float, layerwise: bool) -> None:
        """Prefill of `r` done on prompt machine `p`, in the batch from `start` to `end`: send its KV
        to its token machine (layer by layer: under that batch; else after it, behind `p`'s earlier
        transfers), with pull once that one has memory for it (policy/cluster.py pull_kv; else the
        simulation sends it when memory is freed). Its landing is due as a TRANSFER_END event."""
        t = self.state.machines[r.token_machine]
        if not r.kv_on_token_machine and not pull_kv(t, r):
            return
        link = self.link(p, t)
        nbytes = (r.prefill_len - 1 - self.skipped(t, r)) * self.kv_bytes  # a recompute's outputs too
        mt = self.state.metrics
        if layerwise:
            ready = start
            done = layerwise_done(link, nbytes, self.layers, start, end)
            mt.transfer_layerwise += 1
        else:
            ready = max(end, self.links_out[p.id])
            done = serialized_done(link, nbytes, ready)
            self.links_out[p.id] = done
        if self.trace is not None:
            self.trace.transfer(p.id, t.id, r.id, ready, done, nbytes, layerwise)
        mt.transfers += 1
        mt.transfer_bytes += nbytes
        mt.transfer_visible.add(done - end)
        self.state.push(done, TRANSFER_END, r)
