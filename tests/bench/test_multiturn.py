"""`splitserve bench` on conversations without a server: the `prefix_cache` section every bench
summary gets from the server's `usage.prompt_tokens_details.cached_tokens`, and the options these
workloads refuse. Against a live server: tests/serve/test_bench_multiturn_live.py."""

from __future__ import annotations

import pytest

from splitserve.bench.client import _Reading
from splitserve.bench.collector import Collector, RequestRecord
from splitserve.bench.options import BenchOptions, validate
from splitserve.bench.sse import DONE, parse_line, usage_cached
from splitserve.bench.summary import bench_summary
from splitserve.errors import UserError
from splitserve.report.summary import prefix_summary

SHAPE = "turns=3,user=8:24,reply=4:8,think=0.05"

def record(prompt: int, cached: int, outcome: str = "completed") -> RequestRecord:
    r = RequestRecord(0, 0.0, 0.0, prompt, 2, outcome=outcome, ttft=0.1, e2e=0.2, tokens=2,
                      end=1.0, cached_tokens=cached, usage_prompt_tokens=prompt)
    if outcome == "failed":
        r.reason = "http_500"
    return r


def test_the_prefix_cache_hit_rate_is_the_records_cached_over_prompt_tokens():
    c = Collector(4)
    recs = [record(40, 32), record(100, 0), record(64, 48), record(500, 400, "failed")]
    for r in recs:
        c.start(r)
        c.finish(r, [0.1])
    s = bench_summary(c, {"name": "x", "rps": 1.0, "duration_s": 1.0}, url="u", model="m", wall_s=1.0, options={})
    done = [r for r in recs if r.outcome == "completed"]          # a failed request counts in neither
    assert s["prefix_cache"] == prefix_summary(204, 80)
    assert s["prefix_cache"]["hit_rate"] == sum(r.cached_tokens for r in done) / sum(r.prompt_tokens for r in done)
    empty = Collector(0)
    assert "prefix_cache" not in bench_summary(empty, {}, url="u", model="m", wall_s=0.0, options={})


def test_cached_tokens_come_from_the_final_usage():
    usage = 'data: {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 1%s}}'
    assert usage_cached(parse_line(usage % ', "prompt_tokens_details": {"cached_tokens": 32}')) == 32
    assert usage_cached(parse_line(usage % "")) == 0                       # usage without the details
    assert usage_cached(parse_line('data: {"choices": [{"text": "a"}]}')) is None
    rec = RequestRecord(0, 0.0, 0.0, 40, 1)
    reading = _Reading(rec, 0.0, [], False)
    for line in ('data: {"choices": [{"text": "a", "token_ids": [7]}]}',
                 usage % ', "prompt_tokens_details": {"cached_tokens": 32}'):
        assert not reading.add(parse_line(line))
    assert reading.add(DONE) and rec.outcome == "completed" and rec.cached_tokens == 32
    # a conversation's turn needs the generated ids (choices[].token_ids) for the next prompt
    rec = RequestRecord(0, 0.0, 0.0, 40, 1)
    reading = _Reading(rec, 0.0, [], False, reply=[])
    assert not reading.add(parse_line('data: {"choices": [{"text": "a"}]}'))
    assert reading.add(DONE) and rec.outcome == "failed" and rec.reason.startswith("no_token_ids")


REFUSED = [
    (dict(endpoint="chat"), "use --endpoint completions --prompt-format ids"),
    (dict(prompt_format="text"), "use --endpoint completions --prompt-format ids"),
    (dict(num_prompts=5), "--num-prompts does not apply"),
    (dict(burstiness=0.5), "--burstiness"),
    (dict(arrivals="trace"), "--arrivals trace"),
    (dict(max_tokens_cap=4), "--conversation"),
    (dict(conversation="turns=0"), "turns >= 1"),
    (dict(workload="coding", conversation="turns=2"), "--conversation shapes"),
]


def test_conversation_options_are_refused_in_one_line():
    validate(BenchOptions(url="http://127.0.0.1:1", workload="multiturn", rps=1.0, duration=5.0, conversation=SHAPE))
    for kw, says in REFUSED:
        opts = dict(url="http://127.0.0.1:1", workload="multiturn", rps=1.0, duration=5.0)
        opts.update(kw)
        with pytest.raises(UserError) as e:
            validate(BenchOptions(**opts))
        assert says in str(e.value) and "\n" not in str(e.value), kw


