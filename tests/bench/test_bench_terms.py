"""bench in `vllm bench serve`'s terms, the pure parts: gamma arrivals, TPOT, goodput, percentiles,
the dataset readers, the context check and the failure line. Hand-computed numbers throughout."""

import json
import math

import numpy as np
import pytest

from splitserve.bench.arrivals import gamma_arrivals
from splitserve.bench.collector import Collector, RequestRecord
from splitserve.bench.datasets import Conversation, random_sizes, read_sharegpt, sharegpt_order
from splitserve.bench.metrics import (GoodputSLO, ms_aliases, parse_goodput, parse_percentiles,
                                      percentile_name, tpot)
from splitserve.bench.options import BenchOptions, validate
from splitserve.bench.plan import Caps, PlannedRequest, capped
from splitserve.bench.run import failure_message
from splitserve.bench.server_check import check_context, choose_model
from splitserve.bench.sse import chunk_output, chunk_tokens
from splitserve.errors import UserError
from splitserve.report.histogram import Histogram

# ---- arrivals ---------------------------------------------------------------------------------


def test_gamma_arrivals_are_exact_for_a_seed():
    a = list(gamma_arrivals(10, 0.5, 7, count=5))
    rng = np.random.default_rng([7, 0xA77])                 # the arrivals' own stream
    want = np.cumsum(rng.gamma(0.5, 1 / (10 * 0.5), 4096))[:5]
    assert a == want.tolist()
    assert list(gamma_arrivals(10, 0.5, 7, count=5)) == a   # same seed, same times
    assert list(gamma_arrivals(10, 0.5, 8, count=5)) != a
    # the counts of one seeded run, 10 req/s for 100 s (measured once, pinned)
    assert [len(list(gamma_arrivals(10, b, 0, duration=100))) for b in (0.25, 1, 4)] == [1054, 1007, 1021]


def test_duration_and_count_bound_the_arrivals():
    a = list(gamma_arrivals(50, 1, 3, duration=2))
    assert a and a[-1] < 2 and a == sorted(a)
    assert len(list(gamma_arrivals(50, 1, 3, duration=2, count=10))) == 10
    assert len(list(gamma_arrivals(50, 1, 3, count=9000))) == 9000      # more than one 4096 block
    with pytest.raises(ValueError):
        list(gamma_arrivals(50, 1, 3))


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gamma_arrivals_have_the_asked_rate_and_spread(burstiness, seed):
    rate, n = 20.0, 20000
    gaps = np.diff([0.0, *gamma_arrivals(rate, burstiness, seed, count=n)])
    # gamma(shape B, scale 1/(rate B)): mean 1/rate, standard deviation 1/(rate sqrt(B))
    sd = 1 / (rate * math.sqrt(burstiness))
    assert abs(gaps.mean() - 1 / rate) < 4 * sd / math.sqrt(n)          # 4 standard errors
    # the coefficient of variation is 1/sqrt(B): 2, 1, 0.5 (Poisson at B = 1)
    cv = gaps.std() / gaps.mean()
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)
    # arrivals in 100 s: a renewal count, mean rate*t and variance rate*t*cv^2
    count = len(list(gamma_arrivals(rate, burstiness, seed, duration=100)))
    assert abs(count - rate * 100) < 4 * math.sqrt(rate * 100 / burstiness)


# ---- TPOT, goodput, percentiles ----------------------------------------------------------------


def rec(i, ttft, e2e, tokens, outcome="completed", prompt=10, usage_prompt=10):
    r = RequestRecord(i, 0.0, 0.0, prompt, tokens, outcome=outcome, ttft=ttft, e2e=e2e, tokens=tokens,
                      end=e2e, usage_prompt_tokens=usage_prompt)
    if outcome == "failed":
        r.reason = "http_500: boom"
    return r


def test_tpot_by_hand():
    assert tpot(0.1, 0.5, 5) == pytest.approx(0.1)        # (0.5 - 0.1) / 4
    assert tpot(0.2, 0.3, 3) == pytest.approx(0.05)
    assert tpot(0.2, 0.2, 1) is None                      # one token: no TPOT
    assert tpot(None, 0.3, 3) is None


def test_collector_tpot_goodput_and_tokens_on_hand_built_records():
    slo = parse_goodput(["ttft:150", "tpot:80"])
    assert slo == GoodputSLO(ttft=0.15, tpot=0.08)
    c = Collector(5, goodput=slo)
    a = rec(0, 0.10, 0.50, 5)           # tpot 100 ms > 80: not good
    b = rec(1, 0.12, 0.24, 4)           # tpot 40 ms, ttft 120 ms: good
    d = rec(2, 0.20, 0.20, 1)           # ttft 200 ms > 150: not good (one token: no tpot)
    e = rec(3, 0.05, 0.05, 1, prompt=7, usage_prompt=8)   # good; the server counted 8 prompt tokens
    f = rec(4, None, None, 0, outcome="failed")
    for r, gaps in ((a, [0.1] * 4), (b, [0.02, 0.06, 0.04]), (d, []), (e, []), (f, [])):
        c.start(r)
        c.begin(r)
        c.active -= 1
        c.finish(r, gaps)
    assert [r.tpot for r in (a, b, d, e)] == [pytest.approx(0.1), pytest.approx(0.04), None, None]
    assert [r.max_tbt for r in (a, b, d, e)] == [0.1, 0.06, None, None]
    assert [r.good for r in (a, b, d, e, f)] == [False, True, False, True, False]
    assert c.good == 2 and c.completed == 4 and c.failed == 1
    assert c.tpot.n == 2 and c.tpot.mean == pytest.approx(0.07)          # (0.1 + 0.04) / 2
    assert c.input_tokens == 10 + 10 + 10 + 7 and c.output_tokens == 5 + 4 + 1 + 1
    assert c.prompt_tokens_off == 1 and c.no_prompt_usage == 0

    # the tbt limit is each request's largest gap; e2el bounds the whole request
    assert GoodputSLO(tbt=0.05).meets(0.1, 0.04, 0.06, 0.3) is False
    assert GoodputSLO(tbt=0.06, e2el=0.3).meets(0.1, 0.04, 0.06, 0.3) is True
    assert GoodputSLO(e2el=0.29).meets(0.1, 0.04, 0.06, 0.3) is False


def test_summary_goodput_and_throughput_numbers():
    from splitserve.bench.summary import bench_summary

    c = Collector(2, goodput=GoodputSLO(ttft=0.15))
    for i, (ttft, e2e, n) in enumerate(((0.1, 0.5, 5), (0.3, 1.0, 8))):
        r = rec(i, ttft, e2e, n, prompt=100)
        c.start(r)
        c.begin(r)
        c.finish(r, [(e2e - ttft) / (n - 1)] * (n - 1))
    s = bench_summary(c, {"name": "x", "rps": 1.0, "duration_s": 1.0}, url="u", model="m", wall_s=1.0,
                      options={}, percentiles=(50.0, 99.5))
    # the span is first scheduled arrival (0) -> last end (1.0 s)
    assert s["total_input_tokens"] == 200 and s["total_output_tokens"] == 13
    assert s["input_throughput"] == 200.0 and s["output_throughput"] == 13.0
    assert s["total_token_throughput"] == 213.0
    assert s["goodput"] == {"slo_ms": {"ttft": 150.0}, "good": 1, "fraction": 0.5, "rate_rps": 1.0}
    assert s["request_goodput"] == 1.0
    assert s["tpot_s"]["mean"] == pytest.approx((0.1 + 0.1) / 2)          # 0.4/4 and 0.7/7
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    assert s["median_ttft_ms"] == s["p50_ttft_ms"] == pytest.approx(s["ttft_s"]["p50"] * 1000)
    assert s["p99.5_e2el_ms"] == pytest.approx(1000.0, rel=5e-4)          # the larger E2E, 1.0 s
    assert "p99_ttft_ms" not in s and s["bench"]["percentiles"] == [50.0, 99.5]


def test_parse_goodput_forms_and_errors():
    want = GoodputSLO(ttft=0.5, tpot=0.05, e2el=2.0)
    assert parse_goodput(["ttft:500 tpot:50", "e2e:2000"]) == want
    assert parse_goodput(["ttft:500,tpot:50,e2el:2000"]) == want
    assert parse_goodput(None) is None and parse_goodput([]) is None
    assert want.as_ms() == {"ttft": 500.0, "tpot": 50.0, "e2el": 2000.0}
    for bad, msg in ((["ttft"], "KEY:MILLISECONDS"), (["itl:5"], "KEY:MILLISECONDS"), (["ttft:-1"], "positive"),
                     (["ttft:x"], "positive"), (["ttft:1", "ttft:2"], "twice"), (["e2e:1 e2el:2"], "twice")):
        with pytest.raises(UserError, match=msg):
            parse_goodput(bad)


def test_percentiles():
    assert parse_percentiles("50, 90,99,99.9,50") == (50.0, 90.0, 99.0, 99.9)
    assert [percentile_name(p) for p in (50.0, 99.0, 99.9)] == ["p50", "p99", "p99.9"]
    for bad in ("0", "101", "x", ""):
        with pytest.raises(UserError, match="--percentiles"):
            parse_percentiles(bad)
    h = Histogram()
    for v in (0.010, 0.020, 0.030, 0.040):
        h.add(v)
    out = ms_aliases({"ttft": h, "tpot": Histogram()}, (50.0, 75.0))
    assert out["mean_ttft_ms"] == pytest.approx(25.0)                     # exact: the sum is kept
    assert out["p50_ttft_ms"] == pytest.approx(20.0, rel=5e-4)            # nearest rank, 0.05%
    assert out["p75_ttft_ms"] == pytest.approx(30.0, rel=5e-4)
    assert out["median_ttft_ms"] == out["p50_ttft_ms"]
    assert out["mean_tpot_ms"] is None and out["p75_tpot_ms"] is None     # no sample


# ---- datasets ----------------------------------------------------------------------------------


def test_random_sizes_range_and_seed():
    sizes = random_sizes(4000, 100, 10, 0.5, seed=3)
    ins, outs = np.array(sizes).T
    assert ins.min() == 50 and ins.max() == 150            # floor(100 * 0.5) .. floor(100 * 1.5), both hit
    assert outs.min() == 5 and outs.max() == 15
    assert abs(ins.mean() - 100) < 4 * np.sqrt((101 ** 2 - 1) / 12 / 4000)   # uniform on 101 integers
    assert random_sizes(4000, 100, 10, 0.5, seed=3) == sizes
    assert random_sizes(5, 64, 8, 0.0, seed=1) == [(64, 8)] * 5
    assert random_sizes(30, 1, 1, 0.9, seed=0) == [(1, 1)] * 30          # draws in 0..1, 0 raised to 1
    with pytest.raises(UserError, match="range-ratio"):
        random_sizes(3, 10, 10, 1.0, 0)
    with pytest.raises(UserError, match="at least 1"):
        random_sizes(3, 0, 10, 0.0, 0)


def write(tmp_path, obj, name="sg.json"):
    p = tmp_path / name
    p.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    return str(p)


def test_read_sharegpt(tmp_path):
    data = [
        {"id": "a", "conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi!"},
                                      {"from": "human", "value": "second"}, {"from": "gpt", "value": "later"}]},
        {"conversations": [{"from": "system", "value": "be nice"}, {"from": "human", "value": "q2"},
                           {"from": "gpt", "value": "a2"}]},
        {"conversations": [{"from": "human", "value": "no reply"}]},
        {"conversations": [{"from": "gpt", "value": "reply first"}, {"from": "human", "value": "q4"}]},
        {"no": "conversations"}, "junk",
        {"conversations": [{"from": "human", "value": 5}, {"from": "human", "value": "q6"}, {"from": "gpt", "value": "a6"}]},
    ]
    assert read_sharegpt(write(tmp_path, data)) == [Conversation("hello there", "hi!"), Conversation("q2", "a2"),
                                                   Conversation("q6", "a6")]
    for bad, msg in (("{not json", "not a JSON file"), ({"a": 1}, "expected a JSON list"),
                     ([{"conversations": []}], "no conversation")):
        with pytest.raises(UserError, match=msg):
            read_sharegpt(write(tmp_path, bad, "bad.json"))
    with pytest.raises(UserError, match="file not found"):
        read_sharegpt(str(tmp_path / "missing.json"))
    order = sharegpt_order(10, 4)
    assert sorted(order) == list(range(10)) and order == sharegpt_order(10, 4) != sharegpt_order(10, 5)


def test_caps_and_clipping():
    assert capped(600, 128, Caps()) == (600, 128)
    assert capped(600, 128, Caps(), max_context=512) == (384, 128)       # output kept, prompt fills the rest
    assert capped(600, 900, Caps(), max_context=512) == (1, 511)
    assert capped(600, 128, Caps(100, 20), max_context=512) == (100, 20)


# ---- the server checks and the failure line ---------------------------------------------------


def test_choose_model_and_context():
    models = [{"id": "tiny", "max_model_len": 512}, {"id": "other"}]
    assert choose_model(models, None, "u", True) == ("tiny", 512)
    assert choose_model(models, "other", "u", True) == ("other", None)
    assert choose_model([], "x", "u", True) == ("x", None)                # the server lists none
    with pytest.raises(UserError, match="does not serve the model 'llama' \\(it serves: tiny, other\\)"):
        choose_model(models, "llama", "u", True)
    assert choose_model(models, "llama", "u", False) == ("llama", None)


def test_check_context_names_the_count_and_the_longest():
    plan = [PlannedRequest(0, 0, 400, 100), PlannedRequest(1, 0, 500, 20), PlannedRequest(2, 0, 3211, 9),
            PlannedRequest(3, 0, 412, 100)]
    check_context(plan[:1] + plan[3:], 512)                               # 500 and 512: fit
    with pytest.raises(UserError) as e:
        check_context(plan, 512)
    assert str(e.value).startswith("2 of 4 requests need more than the server's context of 512 tokens "
                                   "(the longest: 3,211 prompt + 9 output tokens)")


def test_failure_message():
    def summary(n, failed, rejected, first=None, statuses=None):
        return {"requests": n, "failed": failed, "bench": {"rejected": rejected, "first_error": first,
                                                           "rejected_by_status": statuses or {}}}
    assert failure_message(summary(10, 5, 0, "x"), 0.5) is None           # half is not most
    assert failure_message(summary(10, 3, 3, "http_400: too long", {"429": 3}), 0.5) == (
        "6 of 10 requests did not complete (3 failed, 3 rejected; more than --max-failure-ratio 0.5); "
        "first: http_400: too long")
    assert failure_message(summary(4, 0, 4, None, {"503": 4}), 0.5).endswith("first: http_503 (rejected)")
    assert failure_message(summary(10, 1, 0, "x"), 0.0) is not None
    assert failure_message(summary(10, 10, 0, "x"), 1.0) is None


@pytest.mark.parametrize("kw, msg", [
    (dict(endpoint="chat", prompt_format="ids"), "--endpoint chat sends text"),
    (dict(endpoint="embeddings"), "--endpoint must be completions or chat"),
    (dict(dataset="sharegpt"), "needs --dataset-path"),
    (dict(dataset_path="x.json"), "--dataset-path goes with --dataset sharegpt"),
    (dict(dataset="sonnet"), "--dataset must be one of workload, random, sharegpt"),
    (dict(burstiness=0.0), "--burstiness must be positive"),
    (dict(max_concurrency=0), "--max-concurrency must be at least 1"),
    (dict(duration=None), "give --duration"),
    (dict(num_prompts=0), "--num-prompts must be at least 1"),
    (dict(prompt_format="bytes"), "--prompt-format must be ids or text"),
])
def test_validate(kw, msg):
    with pytest.raises(UserError, match=msg):
        validate(BenchOptions(url="http://x:1", **kw))
    assert BenchOptions(url="u", endpoint="chat").fmt == "text" and BenchOptions(url="u").fmt == "ids"


# ---- the chat stream ---------------------------------------------------------------------------


def test_chat_chunks():
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    tok = {"choices": [{"index": 0, "delta": {"content": "ab"}, "finish_reason": None}]}
    empty = {"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": None}]}  # half a character
    end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    ids = {"choices": [{"index": 0, "delta": {"content": "x"}, "token_ids": [5, 6], "finish_reason": None}]}
    assert [chunk_tokens(c) for c in (role, tok, empty, end, ids)] == [0, 1, 1, 0, 2]
    assert chunk_output(ids) == ([5, 6], "x") and chunk_output(tok) == ([], "ab")
    assert chunk_output({"choices": [{"text": "t", "token_ids": [9]}]}) == ([9], "t")


def test_burstiness_retimes_a_workload_keeping_its_sizes_in_order():
    from splitserve.bench.planning import workload_plan
    from splitserve.workload import make_workload

    o = BenchOptions(url="u", workload="coding", rps=5.0, duration=20.0, seed=2, burstiness=0.5)
    plan = workload_plan(o, None)
    reqs = list(plan.requests())
    times = list(gamma_arrivals(5.0, 0.5, 2, duration=20.0))
    assert [r.arrival for r in reqs] == times and plan.total == len(times)
    sizes = [(w.prompt_tokens, w.output_tokens) for w, _ in zip(make_workload("coding", rps=5.0, seed=2,
                                                                             max_requests=len(times)), times)]
    assert [(r.prompt_tokens, r.max_tokens) for r in reqs] == sizes
    assert plan.arrivals == "gamma(burstiness=0.5)"
    # burstiness 1 keeps the workload's own Poisson arrivals (the simulator's)
    same = workload_plan(BenchOptions(url="u", workload="coding", rps=5.0, duration=20.0, seed=2), None)
    assert [r.arrival for r in same.requests()] == [w.arrival for w in make_workload("coding", rps=5.0, duration=20.0,
                                                                                      seed=2)]


def test_burstiness_is_refused_for_a_trace_at_its_own_timestamps(tmp_path):
    from splitserve.bench.planning import workload_plan

    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{i * 0.5},{10 + i},{5}\n" for i in range(20)))
    with pytest.raises(UserError, match="add --arrivals poisson"):
        workload_plan(BenchOptions(url="u", workload=str(p), rps=2.0, duration=5.0, burstiness=2.0,
                                    arrivals="trace"), None)
    plan = workload_plan(BenchOptions(url="u", workload=str(p), rps=2.0, duration=5.0, burstiness=2.0,
                                       arrivals="poisson"), None)
    assert plan.total == len(list(gamma_arrivals(2.0, 2.0, 0, duration=5.0)))


# ---- exact-length text prompts -----------------------------------------------------------------


class LocalCount:
    """The `count` of bench.prompts.ServerTokenizer from a real tokenizer in this process (the live
    path, through the server's /tokenize, is tests/serve/test_bench_live.py)."""

    def __init__(self, tk) -> None:
        self.tk, self.calls = tk, 0

    async def count(self, text: str) -> int:
        self.calls += 1
        return len(self.tk.encode(text).ids)


def trained_bpe():
    """A BPE tokenizer with merges (800 entries), trained on seeded random words: unlike tiny's
    byte-level one, a character adds 0 or 1 tokens and merges make the count irregular."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from splitserve.bench.prompts import random_words

    tk = Tokenizer(models.BPE(unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = [random_words(np.random.default_rng([0, i]), 400) for i in range(200)]
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=800, special_tokens=["[UNK]"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tk


def test_fit_text_hits_the_exact_count_with_a_bpe_tokenizer():
    import asyncio

    from splitserve.bench.prompts import fit_text, random_words

    tk = trained_bpe()
    counter = LocalCount(tk)
    rng = np.random.default_rng(1)

    async def all_lengths():
        off, calls = 0, []
        for n in range(5, 400, 3):
            src = random_words(rng, 4 * n + 64)
            full = await counter.count(src)
            before = counter.calls
            text, got = await fit_text(src, n, counter, 0, full)
            calls.append(counter.calls - before)
            assert got == len(tk.encode(text).ids) and src.startswith(text)
            off += got != n
        return off, calls

    off, calls = asyncio.run(all_lengths())
    # measured: every one of the 132 lengths exact, 3.7 tokenize calls each on average, 7 at most
    assert off == 0 and len(calls) == 132
    assert np.mean(calls) < 5 and max(calls) <= 2 * math.log2(4 * 400) + 3


def test_fit_text_with_tiny_is_one_guess_and_below_a_template_is_the_template():
    import asyncio

    from splitserve.bench.prompts import fit_text, random_words
    from splitserve.engine.tokenizer import Tokenizer

    counter = LocalCount(Tokenizer.tiny().tk)              # byte-level, BOS added: chars + 1
    src = random_words(np.random.default_rng(0), 4 * 50 + 64)

    async def go():
        return await fit_text(src, 50, counter, 1, len(src) + 1)

    text, got = asyncio.run(go())
    assert (got, len(text), counter.calls) == (50, 49, 1)   # the proportional guess is exact
    assert asyncio.run(fit_text(src, 20, counter, 25, len(src) + 1)) == ("", 25)   # n under the empty count
