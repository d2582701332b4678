"""`splitserve bench --workload multiturn` / `sysprompt` against the session's real unsplit tiny
server (one mixed worker, prefix caching on, its default): conversations sent closed-loop
(bench/conversations.py), each turn carrying the token ids the server returned, and each turn's
`usage.prompt_tokens_details.cached_tokens`. The options and summary without a server:
tests/bench/test_multiturn.py."""

from __future__ import annotations

from splitserve.bench.conversations import planned_turns
from splitserve.bench.options import BenchOptions
from splitserve.report.summary import prefix_summary
from splitserve.workload import make_workload

SHAPE = "turns=3,user=8:24,reply=4:8,think=0.05"
BLOCK = 16                                  # the engine's KV block tokens

def bench(srv, **kw):
    from splitserve.bench.run import run_bench

    opts = dict(url=srv.url, workload="multiturn", conversation=SHAPE, rps=20.0, duration=1.0, seed=3)
    opts.update(kw)
    return run_bench(BenchOptions(**opts), return_records=True)


def by_conversation(recs) -> dict[int, list]:
    convs: dict[int, list] = {}
    for r in sorted(recs, key=lambda r: (r.conversation, r.turn)):
        convs.setdefault(r.conversation, []).append(r)
    return convs


def test_each_turn_carries_the_servers_reply_and_finds_its_history_cached(single_server, tmp_path):
    s, recs = bench(single_server, save_outputs=True, out=tmp_path)
    conv = make_workload("multiturn", rps=20.0, duration=1.0, seed=3, conversation=SHAPE)
    first = list(conv)
    assert len(first) >= 3
    n = 3 * len(first)                                   # no context cap: every conversation has 3 turns
    assert planned_turns(conv) == n
    assert s["requests"] == s["completed"] == len(recs) == n and s["failed"] == 0
    assert s["bench"]["conversations"] == len(first) and s["bench"]["turns_not_sent"] == 0
    assert sorted(r.index for r in recs) == list(range(n))
    convs = by_conversation(recs)
    assert sorted(convs) == list(range(len(first)))
    for c, turns in convs.items():
        assert [r.turn for r in turns] == [0, 1, 2]
        assert turns[0].prompt == first[c].prompt and turns[0].arrival == first[c].arrival
        assert turns[0].cached_tokens == 0                 # random ids: nothing shared across conversations
        for prev, r in zip(turns, turns[1:]):
            assert len(prev.output_ids) == prev.tokens == prev.max_tokens
            history = prev.prompt + prev.output_ids        # the server's own reply, token for token
            assert r.prompt[:len(history)] == history and len(r.prompt) == r.prompt_tokens > len(history)
            assert r.usage_prompt_tokens == r.prompt_tokens
            assert r.arrival >= prev.end and r.sent >= prev.end            # closed loop: after the reply
            # one worker: it computed the KV of the history but the reply's last token; its full
            # blocks are cached and this turn's prefill takes them
            assert r.cached_tokens >= (len(history) - 1) // BLOCK * BLOCK
    assert sum(r.cached_tokens for r in recs if r.turn == 2) >= len(first) * BLOCK   # turn 2: >= 8+4+8+4-1 tokens
    queries, hits = sum(r.prompt_tokens for r in recs), sum(r.cached_tokens for r in recs)
    assert hits > 0 and s["prefix_cache"] == prefix_summary(queries, hits)
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert len(lines) == n and '"conversation": 0, "turn": 0' in "".join(lines)


def test_a_failed_turn_ends_its_conversation(single_server):
    # tiny's context is 512 tokens: turn 2's prompt (about 608) is refused, turn 3 is never sent
    shape = "turns=4,user=200:200,reply=4:4,think=0"
    s, recs = bench(single_server, conversation=shape, rps=40.0, duration=0.3, seed=1)
    k = s["bench"]["conversations"]
    assert k >= 1 and s["requests"] == 3 * k and s["completed"] == 2 * k and s["failed"] == k
    assert s["bench"]["turns_not_sent"] == k
    assert sorted(r.turn for r in recs if r.outcome == "failed") == [2] * k
    assert all(r.reason.startswith("http_400") for r in recs if r.outcome == "failed")
    # the same conversations ended at the server's context instead: no failures, no turn 2
    s, recs = bench(single_server, conversation=shape, rps=40.0, duration=0.3, seed=1, clip_to_context=True)
    assert s["requests"] == s["completed"] == 2 * k and s["bench"]["turns_not_sent"] == 0


def test_sysprompt_requests_share_the_system_prompt_blocks(single_server):
    s, recs = bench(single_server, workload="sysprompt", conversation="system=64,user=8:24,reply=4:8", rps=20.0,
                    duration=0.5)
    k = s["bench"]["conversations"]
    assert k >= 2 and s["requests"] == s["completed"] == k and {r.turn for r in recs} == {0}
    first_end = min(r.end for r in recs)
    later = [r for r in recs if r.sent > first_end]           # the first request's prompt blocks were cached
    assert later and all(r.cached_tokens >= 64 for r in later)
    assert s["prefix_cache"]["hits"] >= 64 * len(later)
