"""Driving an engine in tests: every request to its end."""

from __future__ import annotations


def run_to_end(eng, prompts, params) -> list:
    """Add `prompts` (all with `params`) and step `eng` until nothing is left; each request's
    final output, in the order of `prompts`."""
    ids = [eng.add_request(p, params) for p in prompts]
    done = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    return [done[i] for i in ids]
