"""The engine-step comparison of `splitserve twin` (twin/steps.py): a step log's lines read as
step shapes, the overlap of each step with the other workers' steps, and the model's time for
each step summed by kind and condition, all hand-computed."""

from __future__ import annotations

import dataclasses
import json

import pytest

from splitserve.twin.corun import BESIDE_PROMPT
from splitserve.twin.steps import (Step, busy_spans, compare_steps, drift, lone_spread, overlaps, read_steps, run_speed,
                                   slowest_step, step_of)


def test_a_line_is_prefill_chunks_and_decodes():
    s = step_of(3, {"t": 10.0, "s": 0.25, "seqs": [[0, 512], [300, 1], [40, 1], [128, 64], [0, 1]], "sent": [512]})
    assert s.sent == (512,) and step_of(0, {"t": 0, "s": 1, "seqs": [[0, 8]]}).sent == ()
    # prefill: 512 (first chunk), 64 (a later chunk, more than one token), 1 (a one-token prompt)
    assert (s.prompt_tokens, s.prompt_sq) == (577, 512 ** 2 + 64 ** 2 + 1)
    # decodes: KV before the step + the token run
    assert (s.decodes, s.context, s.longest) == (2, 301 + 41, 301)
    assert s.kind == "mixed" and (s.worker, s.start, s.seconds) == (3, 10.0, 0.25)
    assert step_of(0, {"t": 0, "s": 1, "seqs": [[0, 513]]}).kind == "prompt > 512"
    assert step_of(0, {"t": 0, "s": 1, "seqs": [[0, 512]]}).kind == "prompt <= 512"
    assert step_of(0, {"t": 0, "s": 1, "seqs": [[9, 1]]}).kind == "decode"


def test_read_steps_merges_workers_by_start(tmp_path):
    (tmp_path / "worker-0.jsonl").write_text(json.dumps({"t": 2.0, "s": 1.0, "seqs": [[0, 8]]}) + "\n")
    (tmp_path / "worker-1.jsonl").write_text("\n".join(json.dumps({"t": t, "s": 0.5, "seqs": [[5, 1]]})
                                                       for t in (1.0, 3.0)) + "\n")
    steps = read_steps(tmp_path)
    assert [(s.worker, s.start) for s in steps] == [(1, 1.0), (0, 2.0), (1, 3.0)]


def _step(w, start, seconds, prompt=0, decodes=0):
    return Step(w, start, seconds, prompt, prompt * prompt, decodes, 10 * decodes, 10)


def test_overlap_is_the_fraction_of_a_step_another_worker_computed():
    steps = [_step(0, 0.0, 1.0, prompt=100), _step(1, 0.5, 0.25, decodes=1), _step(1, 0.9, 0.2, decodes=1),
             _step(0, 2.0, 1.0, prompt=100), _step(0, 3.0, 0.5, prompt=10)]
    # worker 0's first step: [0.5, 0.75] and [0.9, 1.0] of it -> 0.35; worker 1's first: all of it;
    # its second: [0.9, 1.0] of [0.9, 1.1] -> 0.5; the last two steps of worker 0 ran alone
    assert overlaps(steps) == pytest.approx([0.35, 1.0, 0.5, 0.0, 0.0])


class _Perf:
    attention = True

    def mixed_time(self, prompt_tokens, decodes, context, prompt_sq):
        return 0.001 * prompt_tokens + 1e-6 * prompt_sq + 0.01 * decodes + 0.0001 * context


class _Machine:
    perf = _Perf()
    pinned = True
    host_cores = 2

    @property
    def timing(self):  # the worker-step timing part (twin/worker_timing.py WorkerTiming): this fake too
        return self

    def decode_kv(self, longest, decodes):  # padded to the longest, in blocks of 16
        return decodes * 16 * -(-longest // 16)

    def send_s(self, prompt_tokens):  # 1 ms + 10 us per token
        return 0.001 + 1e-5 * prompt_tokens

    def work_s(self, alone_s, prompt, sent_s=0.0):  # a step overhead of 2 ms
        return alone_s + sent_s + 0.002

    def slowdown(self, prompt, others_busy, core_busy=1, idle_cores=0, beside=()):  # co-run: prompt steps +10%, decodes +50%;
        return (1 + (0.1 if prompt else 0.5) * (others_busy > 0)) * core_busy  # a shared core: x its workers

    def cores_of(self, worker):  # pinned, 2 cores
        return frozenset({worker % 2})


def test_model_seconds_by_kind_and_condition():
    steps = [_step(0, 0.0, 0.2, prompt=100), _step(1, 0.0, 0.05, decodes=2), _step(0, 1.0, 0.1, prompt=50)]
    rows = {(r.kind, r.condition): r for r in compare_steps(steps, _Machine())}
    # prompt 100 (decodes of worker 1 ran through 0.05 of its 0.2 s: 0.25, "partly"):
    # alone 0.1 + 0.01 = 0.11 s + 0.002; model 0.75 of it alone, 0.25 of it x1.1
    p100 = 0.112 * (0.75 + 0.25 * 1.1)
    # the decodes ran with the prompt step through all of them: 0.02 + 2 x 16 padded KV tokens
    # x 0.0001 -> x1.5
    dec = (0.02 + 0.0032 + 0.002) * 1.5
    p50 = 0.05 + 0.0025 + 0.002  # alone
    assert rows["prompt <= 512", "partly"].model_s == pytest.approx(p100)
    assert rows["prompt <= 512", "alone"].model_s == pytest.approx(p50)
    assert rows["prompt <= 512", "all"].steps == 2
    assert rows["decode", "shared"].model_s == pytest.approx(dec)
    total = rows["all", "all"]
    assert total.steps == 3 and total.live_s == pytest.approx(0.35)
    assert total.model_s == pytest.approx(p100 + dec + p50)
    assert total.error == pytest.approx((p100 + dec + p50 - 0.35) / 0.35)


def test_three_workers_on_two_cores_slow_the_steps_that_share_a_core():
    # workers 0 and 2 are pinned to core 0, worker 1 to core 1 (_Machine.cores_of); worker 0's
    # decode step of 0.4 s: worker 1 computes in [0.1, 0.3], worker 2 in [0.2, 0.4]
    steps = [_step(0, 0.0, 0.4, decodes=1), _step(1, 0.1, 0.2, prompt=10), _step(2, 0.2, 0.2, prompt=10)]
    spans = busy_spans(steps, _Machine().cores_of)[0]
    assert [(n, c) for n, c, _, _ in spans] == [(0, 0), (1, 0), (2, 1), (1, 1)]   # (others busy, on core 0)
    assert [t for _, _, t, _ in spans] == pytest.approx([0.1] * 4)
    # beside: (kind, size) of each step of the others: prompt steps of 10 tokens
    assert [k for *_, k in spans] == [(), ((BESIDE_PROMPT, 10),), ((BESIDE_PROMPT, 10), (BESIDE_PROMPT, 10)),
                                      ((BESIDE_PROMPT, 10),)]
    # its work 0.01 + 16 KV tokens x 0.0001 + 0.002: alone 0.1 s, x1.5 co-run 0.1 s, x1.5 x 2 its
    # core shared 0.2 s
    work = 0.01 + 0.0016 + 0.002
    rows = {(r.kind, r.condition): r for r in compare_steps(steps, _Machine())}
    assert rows["decode", "partly"].model_s == pytest.approx(work * (0.1 + 0.1 * 1.5 + 0.2 * 3.0) / 0.4)


def test_a_step_that_hands_kv_over_is_modelled_with_the_senders_time():
    # two lone prompt steps of 100 tokens; the second sent its prompt's KV inside the step
    steps = [Step(0, 0.0, 0.2, 100, 100 ** 2, 0, 0), Step(0, 1.0, 0.2, 100, 100 ** 2, 0, 0, 0, (100,))]
    rows = {(r.kind, r.condition): r for r in compare_steps(steps, _Machine())}
    alone = 0.1 + 0.01
    assert rows["prompt <= 512", "alone"].model_s == pytest.approx((alone + 0.002) + (alone + 0.001 + 0.001 + 0.002))


def test_the_hosts_speed_from_the_lone_steps_only():
    steps = [_step(0, 0.0, 0.2, prompt=100), _step(1, 0.0, 0.05, decodes=2), _step(0, 1.0, 0.1, prompt=50)]
    p100, dec, p50 = 0.112 * (0.75 + 0.25 * 1.1), (0.02 + 0.0032 + 0.002) * 1.5, 0.05 + 0.0025 + 0.002
    assert drift(steps, _Machine()) == pytest.approx(((0.2 + 0.1) / (p100 + p50), 0.05 / dec))
    # alone: only the 50-token prompt step (the other prompt step overlapped the decodes by 25%);
    # no decode step ran alone, so decode keeps the speed the machine had
    assert drift(steps, _Machine(), alone_only=True) == pytest.approx((0.1 / p50, 1.0))

    @dataclasses.dataclass(frozen=True)
    class Drifted:
        drift: tuple[float, float]

    assert run_speed(steps, Drifted((1.1, 0.9)), _Machine()).drift == pytest.approx((1.1 * 0.1 / p50, 0.9))


def test_the_hosts_spread_is_its_lone_steps_about_their_speed():
    # two lone decode steps, 10% and 30% slower than modelled (2 decodes, 2 x 16 KV tokens read,
    # the step overhead): the speed x1.2 (their sums), the spread 1.1 / 1.2 and 1.3 / 1.2; the
    # decode step beside a prompt is not lone
    # (each worker's first 0.5 s of steps, its warm-up, 4.7x and 2x here, are left out)
    dec = 0.02 + 0.0032 + 0.002
    steps = [_step(0, -1.0, 4.7 * dec, decodes=2), _step(0, -0.6, 2 * dec, decodes=2),
             _step(0, 0.0, 1.1 * dec, decodes=2), _step(0, 1.0, 1.3 * dec, decodes=2),
             _step(0, 2.0, 0.2, prompt=100), _step(1, 2.0, 0.05, decodes=2)]
    lone = drift(steps, _Machine(), alone_only=True)
    assert lone == pytest.approx((1.0, 1.2))
    prompts, decodes = lone_spread(steps, _Machine(), lone)
    assert prompts == () and decodes == pytest.approx((1.1 / 1.2, 1.3 / 1.2))

    @dataclasses.dataclass(frozen=True)
    class Host:
        drift: tuple[float, float] = (1.0, 1.0)
        spread: tuple = ((), ())

    assert run_speed(steps, Host(), _Machine()).spread == ((), ())
    assert run_speed(steps, Host(), _Machine(), spread=True).spread[1] == pytest.approx((1.1 / 1.2, 1.3 / 1.2))


def test_the_slowest_step_is_the_most_cpu_over_its_shape_median_after_the_warm_up():
    def step(w, start, cpu, prompt=0, decodes=0):
        return Step(w, start, cpu, prompt, prompt * prompt, decodes, 10 * decodes, 10, (), cpu)

    # worker 0: 16-token prompts of 30 ms each second from 1.0 s, and one of 57 ms at 4.5 s (x1.9);
    # worker 1: decodes of 20 ms every 0.1 s from 0.9 s, one of 70 ms at 1.1 s, in its warm-up (its
    # first 0.5 s: not counted), and one of 30 ms at 2.5 s (x1.5); a shape run only twice (512-token
    # prompts of 0.2 and 0.9 s) is not compared
    steps = ([step(0, 1.0 + i, 0.030, prompt=16) for i in range(6)] + [step(0, 4.5, 0.057, prompt=16)]
             + [step(1, 0.9 + 0.1 * i, 0.020, decodes=1) for i in range(12)]
             + [step(1, 1.15, 0.070, decodes=1), step(1, 2.5, 0.030, decodes=1)]
             + [step(0, 5.5, 0.2, prompt=512), step(0, 6.5, 0.9, prompt=512)])
    steps.sort(key=lambda s: s.start)
    ratio, at = slowest_step(steps)
    assert ratio == pytest.approx(0.057 / 0.030) and at == pytest.approx(4.5 - 0.9)  # from the run's first step
    assert slowest_step([dataclasses.replace(s, cpu=0.0) for s in steps]) is None  # a log without CPU seconds
    assert step_of(0, {"t": 0, "s": 0.5, "cpu": 0.4, "seqs": [[0, 8]]}).cpu == 0.4
    assert step_of(0, {"t": 0, "s": 0.5, "seqs": [[0, 8]]}).cpu == 0.0
