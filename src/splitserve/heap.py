"""A serving process's Python heap, frozen once it has started, so that the cyclic garbage
collector's full passes skip what startup made (imports, the tokenizer, the engine's modules,
the app) and pause the process only for the objects made since.

Unfrozen, a full pass walks every tracked object: in `serve`'s router process one took 296 ms
of a 2-core host where four workers computed beside it, at the same moment of every run of the
same requests, and every request in flight waited for it: a prompt reached the router 280 ms
late, a first token left it 196 ms late, another reached the client 310 ms late
(benchmarks/twin/README.md, "A 300 ms pause"). Frozen, the same run's passes took 1 ms in all
and those waits 16, 10 and 26 ms at most. vLLM freezes its server's heap after startup for the
same reason."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def freeze_heap() -> int:
    """Collect what startup left for the collector, then move every surviving object to the
    permanent generation (gc.freeze), for the rest of the process; the objects frozen. Objects
    made later are collected as usual."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@contextmanager
def frozen_heap() -> Iterator[int]:
    """freeze_heap for the block only: a caller that is not a process of its own, such as a test
    calling `run_bench`, gets its heap back collectable after it (gc.unfreeze: every frozen
    object, whoever froze it)."""
    try:
        yield freeze_heap()
    finally:
        gc.unfreeze()
