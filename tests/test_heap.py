"""heap.py: what startup made is out of the collector's full passes once frozen, and a block
frozen with `frozen_heap` gives the heap back, collectable, after it."""

import gc
import weakref

from splitserve.heap import freeze_heap, frozen_heap


class Node:
    def __init__(self) -> None:
        self.other = self


def cycle() -> weakref.ref:
    """A reference cycle nobody holds: only the cyclic collector frees it."""
    return weakref.ref(Node())


def test_frozen_cycles_survive_full_passes_until_the_heap_is_given_back():
    gc.collect()
    before = gc.get_freeze_count()
    try:
        kept = [Node() for _ in range(1000)]
        startup = weakref.ref(kept[0])
        frozen = freeze_heap()
        assert frozen >= before + 1000
        del kept                       # startup's cycles become garbage after the freeze
        made_later = cycle()           # and a cycle made while serving
        gc.collect()
        assert made_later() is None    # collected as usual
        assert startup() is not None   # frozen: no pass looks at it
    finally:
        gc.unfreeze()
    gc.collect()
    assert startup() is None


def test_frozen_heap_freezes_the_block_only():
    gc.collect()
    with frozen_heap() as n:
        assert n > 0 and gc.get_freeze_count() > 0
        inside = cycle()
        gc.collect()
        assert inside() is None
    assert gc.get_freeze_count() == 0
