"""The router's sends and the workers' reports, applied to the view of the workers' prefix caches
(prefix_view.py) where the worker is live and keeps a cache; a part of the policy view
(cluster_state.py `LiveCluster.prefixes`)."""

from __future__ import annotations

from ..policy.state import Request
from .cluster_view import ClusterView


class ViewPrefixes:
    """Each call is a no-op when the workers keep no prefix cache (`view.prefix` None)."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view

    def sent(self, r: Request) -> None:
        """`r`'s prompt goes to its prompt worker, which looks it up in its cache."""
        v = self.view
        if v.prefix is not None:
            v.prefix.sent(v.machines[r.prompt_machine], r)

    def reported(self, wid: int, r: Request, chunk: int, cached: int) -> None:
        """Worker `wid` started `r`'s prompt with a chunk of `chunk` tokens, `cached` from its cache."""
        v = self.view
        if v.prefix is not None and r.prompt_machine == wid and v.live(v.machines[wid]):
            v.prefix.reported(v.machines[wid], r, chunk, cached)

    def reserved(self, r: Request, skip: int | None) -> None:
        """`r`'s token worker reserved its KV, with `skip` prompt tokens from its cache."""
        v = self.view
        if v.prefix is not None and skip is not None and v.live(t := v.machines[r.token_machine]):
            v.prefix.reserved(t, r, skip)

    def finished(self, r: Request, prompt_ids: list[int], output: list[int]) -> None:
        """`r` made `output` and is done: its decoding worker holds prompt + output but the last
        (a request ended at its first token ended on its prompt worker, which holds its prompt)."""
        v = self.view
        if v.prefix is not None and len(output) > 1 and v.live(m := v.decoder(r)):
            v.prefix.finished(m, r, prompt_ids + output[:-1])
