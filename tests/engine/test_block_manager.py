"""Block accounting: free list, reference counts, copy on write."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.engine.block_manager import BlockManager, NoFreeBlocks

ops = st.lists(st.tuples(st.sampled_from(["alloc", "append", "fork", "free"]),
                         st.integers(0, 7), st.integers(0, 7), st.integers(1, 40)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops=ops, num_blocks=st.integers(1, 24), block_size=st.sampled_from([1, 4, 16]))
def test_random_workload_keeps_accounts_and_frees_everything(ops, num_blocks, block_size):
    bm = BlockManager(num_blocks, block_size)
    # which token positions each sequence has written, per block: a block written by one
    # sequence must never be written by another (sharing is read-only; writes copy first)
    writer: dict[int, str] = {}
    for op, a, b, n in ops:
        sa, sb = f"s{a}", f"s{b}"
        try:
            if op == "alloc" and not bm.has(sa):
                bm.allocate(sa, n)
                for blk in bm.block_table(sa):
                    writer[blk] = sa
            elif op == "append":
                before = bm.num_tokens(sa)
                free_before = bm.num_free
                need = bm.blocks_needed(sa, before + n)
                copies = bm.append(sa, before + n)
                assert free_before - bm.num_free == need
                for src, dst in copies:
                    assert bm.ref_count(src) >= 1 and bm.ref_count(dst) == 1
                table = bm.block_table(sa)
                bs = bm.block_size
                for p in range(before, before + n):  # blocks this append writes into
                    blk = table[p // bs]
                    assert bm.ref_count(blk) == 1, "a write into a shared block"
                    writer[blk] = sa
            elif op == "fork" and bm.has(sa) and not bm.has(sb):
                bm.fork(sa, sb)
            elif op == "free":
                released = sum(1 for b in bm.block_table(sa) if bm.ref_count(b) == 1) if bm.has(sa) else 0
                free_before = bm.num_free
                bm.free(sa)
                assert bm.num_free - free_before == released
        except NoFreeBlocks:
            pass
        bm.check()
    for i in range(8):
        bm.free(f"s{i}")
    bm.check()
    assert bm.num_free == num_blocks


def test_allocation_failure_changes_nothing():
    bm = BlockManager(4, 4)
    bm.allocate("a", 12)
    with pytest.raises(NoFreeBlocks):
        bm.allocate("b", 8)
    with pytest.raises(NoFreeBlocks):
        bm.append("a", 24)
    assert not bm.has("b") and bm.num_tokens("a") == 12 and bm.num_free == 1
    bm.check()


def test_fork_shares_then_copies_the_partial_last_block():
    bm = BlockManager(8, 4)
    bm.allocate("a", 6)  # blocks: one full, one half full
    bm.fork("a", "b")
    assert bm.block_table("a") == bm.block_table("b")
    assert bm.blocks_needed("b", 7) == 1
    copies = bm.append("b", 7)
    assert copies == [(bm.block_table("a")[1], bm.block_table("b")[1])]
    assert bm.block_table("a")[0] == bm.block_table("b")[0]  # the full block stays shared
    assert bm.ref_count(bm.block_table("a")[0]) == 2
    bm.free("a")
    bm.free("b")
    assert bm.num_free == 8
