"""How the simulator times a step of a measured machine (twin/machine.py): co-run, time-sharing
of the host's cores with the other workers and the background load (the serving path, the client,
KV transfers), and the step overhead, hand-computed."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from splitserve.sim.kv_transfer import Link
from splitserve.twin.machine import MachineProfile


def _machine(cores=2):
    facts = {"host_cores": cores, "block_size": 16, "corun": {"prompt": 0.1, "token": 0.2},
             "path": {"step_overhead_s": 0.001, "background_cpu_s": 0.02}}
    return MachineProfile(name="m", facts=facts, perf=None, model=SimpleNamespace(kv_bytes_per_token=1000),
                          link=Link(bandwidth=1e9, overhead=0.001), transport="tcp")


def test_background_is_the_serving_paths_cpu_at_the_rate():
    m = _machine()
    assert m.background_cores == 0.0
    assert m.under_load(5.0).background_cores == pytest.approx(5 * 0.02)
    # a split design also moves each prompt's KV: 1 ms + 1,000 tokens x 1,000 bytes at 1 GB/s
    assert m.transfer_s(1000) == pytest.approx(0.002)
    assert m.under_load(5.0, moved_tokens=1000).background_cores == pytest.approx(5 * 0.022)


def test_the_step_timing_follows_the_profile_it_is_part_of():
    """MachineProfile.timing (twin/worker_timing.py) is made anew from the profile's fields
    whenever a profile is: under a load, with a term taken out, or replaced field by field."""
    m = _machine()
    assert (m.timing.facts, m.timing.drift, m.timing.background_cores) == (m.facts, (1.0, 1.0), 0.0)
    assert m.under_load(5.0).timing.background_cores == pytest.approx(5 * 0.02)
    assert dataclasses.replace(m, drift=(2.0, 3.0)).timing.work_s(0.1, prompt=False) == pytest.approx(0.301)
    assert m.without("path").timing.step_overhead == 0.0 and m.timing.step_overhead == 0.001
    assert m.without("corun").timing.slowdown(True, 1) == 1.0
    assert dataclasses.replace(m, facts={**m.facts, "host_cores": 4}).timing.host_cores == 4
    assert m == dataclasses.replace(m) and "timing" not in repr(m)


def test_step_time_by_hand():
    m = _machine().under_load(5.0)  # 0.1 cores of background
    # alone: 1 worker + 0.1 on 2 cores, no sharing; the step overhead
    assert m.timing.step_time(0.1, prompt=True, others_busy=0) == pytest.approx(0.101)
    # another worker computes: co-run +10% (prompt), and 2.1 cores wanted of 2 (the overhead is
    # the worker's CPU too)
    assert m.timing.step_time(0.1, prompt=True, others_busy=1) == pytest.approx(0.101 * 1.1 * 2.1 / 2)
    assert m.timing.step_time(0.1, prompt=False, others_busy=1) == pytest.approx(0.101 * 1.2 * 2.1 / 2)
    # without background the two workers fit their two cores
    assert _machine().timing.step_time(0.1, prompt=False, others_busy=1) == pytest.approx(0.101 * 1.2)
    # one core: any background slows even a lone step
    assert _machine(cores=1).under_load(5.0).timing.step_time(0.1, True, 0) == pytest.approx(0.101 * 1.1)
    # three workers computing on 2 cores: each gets 2 / 3.1 of a core
    assert m.timing.step_time(0.1, prompt=False, others_busy=2) == pytest.approx(0.101 * 1.2 * 3.1 / 2)


def test_pinned_workers_share_their_own_core():
    m = dataclasses.replace(_machine().under_load(5.0), pinned=True)   # 0.05 cores of background per core
    assert [m.timing.cores_of(w) for w in range(3)] == [{0}, {1}, {0}]
    # alone on its core: its share of the background only, and the co-run once another computes
    assert m.timing.step_time(0.1, prompt=False, others_busy=1, core_busy=1) == pytest.approx(0.101 * 1.2 * 1.05)
    # sharing its core with one more: twice as long, whatever the other core does
    assert m.timing.step_time(0.1, prompt=False, others_busy=2, core_busy=2) == pytest.approx(0.101 * 1.2 * 2.05)
    # with the other core idle, it takes the background: the two on one core share it alone
    assert m.timing.step_time(0.1, prompt=False, others_busy=1, core_busy=2, idle_cores=1) == pytest.approx(0.101 * 1.2 * 2)
    # the unpinned host shares all cores: 3.1 / 2
    assert dataclasses.replace(m, pinned=False).timing.step_time(0.1, False, 2) == pytest.approx(0.101 * 1.2 * 1.55)


def test_a_time_shared_core_grows_the_work_by_the_measured_same_core_share():
    base = _machine()
    facts = {**base.facts, "corun": {"prompt": 0.1, "token": 0.2, "same_core": {"prompt": 0.3, "token": 0.05}}}
    m = dataclasses.replace(base, facts=facts, pinned=True).under_load(5.0)  # 0.05 cores of background per core
    # two on one core, all the time: the work x1.3 (prompt), over the co-run's x1.1; twice as long
    assert m.timing.step_time(0.1, prompt=True, others_busy=1, core_busy=2, idle_cores=1) == pytest.approx(0.101 * 1.3 * 2)
    # the decode's same-core growth (x1.05) is under its co-run (x1.2): the co-run holds that part
    assert m.timing.step_time(0.1, prompt=False, others_busy=1, core_busy=2, idle_cores=1) == pytest.approx(0.101 * 1.2 * 2)
    # alone on its core but for its share of the background, next to a busy core: the co-run holds
    assert m.timing.step_time(0.1, prompt=True, others_busy=1, core_busy=1) == pytest.approx(0.101 * 1.1 * 1.05)
    # one core, no other worker, 0.1 cores of background: 10% of the step time-shared, x1.03
    one = dataclasses.replace(_machine(cores=1), facts={**facts, "host_cores": 1}).under_load(5.0)
    assert one.timing.step_time(0.1, prompt=True, others_busy=0) == pytest.approx(0.101 * (1 + 0.3 * 0.1) * 1.1)
    # alone on an idle host nothing is shared: no growth; without the co-run term, none either
    assert m.timing.step_time(0.1, prompt=True, others_busy=0, core_busy=1, idle_cores=1) == pytest.approx(0.101)
    assert m.without("corun").timing.step_time(0.1, True, 1, core_busy=2, idle_cores=1) == pytest.approx(0.101)
    # a profile that did not measure it: the co-run alone, as before
    old = dataclasses.replace(base, pinned=True).under_load(5.0)
    assert old.timing.step_time(0.1, prompt=True, others_busy=1, core_busy=2, idle_cores=1) == pytest.approx(0.101 * 1.1 * 2)


def _sending(cores=2):
    # the sender's part of a transfer: 0.4 ms + bytes at 2 GB/s (the whole: 1 ms + bytes at 1 GB/s)
    return dataclasses.replace(_machine(cores), send_link=Link(bandwidth=2e9, overhead=0.0004))


def test_the_senders_part_of_a_transfer_is_in_its_step_not_in_the_background():
    m = _sending()
    # 1,000 tokens x 1,000 bytes: 0.4 ms + 0.5 ms sending, of 2 ms in all
    assert m.send_s(1000) == pytest.approx(0.0009)
    assert _machine().send_s(1000) == 0.0  # a profile that did not time the sender
    # the background keeps the rest: 5 req/s x (20 ms + 2 ms - 0.9 ms)
    assert m.under_load(5.0, moved_tokens=1000).background_cores == pytest.approx(5 * (0.02 + 0.0011))
    # the step that sends: its time grows by the sending, stretched like the rest of it
    loaded = m.under_load(5.0)  # 0.1 cores
    assert loaded.timing.step_time(0.1, prompt=True, others_busy=0, sent_s=0.0009) == pytest.approx(0.1009 + 0.001)
    assert loaded.timing.step_time(0.1, prompt=True, others_busy=1, sent_s=0.0009) == \
        pytest.approx(0.1019 * 1.1 * 2.1 / 2)


def _profile_dir(tmp_path, sender: bool, cores: int = 2):
    """A measured machine on disk: prompt steps of 1 ms + 0.1 ms per token, decodes of 10 ms, a
    tcp link of 1 ms + 1 GB/s whose sender's part is 0.5 ms + 2 GB/s (or not timed)."""
    import csv
    import json

    from splitserve.twin.profiler import COLUMNS
    d = tmp_path / ("sender" if sender else "old")
    d.mkdir(parents=True)
    with (d / "profile.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for p, b in [(16, 1), (64, 1), (256, 1), (512, 1), (32, 2), (32, 4), (32, 8)]:
            w.writerow({"model": "small", "hardware": "m", "prompt_size": p, "batch_size": b, "token_size": 8,
                        "peak_power": 0, "average_power": 0, "prompt_time": 1 + 0.1 * p * b, "token_time": 10,
                        "e2e_time": 0, "tensor_parallel": 1})
    tcp = {"fixed_s": 0.001, "bandwidth_bytes_per_s": 1e9}
    if sender:
        tcp["sender"] = {"fixed_s": 0.0005, "bandwidth_bytes_per_s": 2e9}
    facts = {"name": "m", "model": "small", "device": "cpu", "dtype": "float32", "kv_capacity_tokens": 100_000,
             "block_size": 16, "num_blocks": 6250, "kv_bytes_per_token": 1024, "max_model_len": 4096,
             "model_config": {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "hidden_size": 128,
                              "num_heads": 2, "intermediate_size": 256, "vocab_size": 1000},
             "links": {"layers": 2, "tcp": tcp}, "host_cores": cores, "corun": {"prompt": 0.0, "token": 0.0}}
    (d / "machine.json").write_text(json.dumps(facts))
    return d


def test_a_simulated_prompt_worker_sends_kv_inside_its_step(tmp_path):
    from splitserve.sim.simulator import SimConfig, Simulation
    from splitserve.twin.machine import load_machine_profile

    def token_times(sender: bool, outputs: int) -> list[float]:
        d = tmp_path / f"{sender}{outputs}"
        m = load_machine_profile(d / ("sender" if sender else "old") if d.exists() else _profile_dir(d, sender))
        req = SimpleNamespace(arrival=0.0, prompt_tokens=100, output_tokens=outputs)
        sim = Simulation(m.cluster("splitwise"), m.model, [req], SimConfig(machine=m, record_requests=True))
        return sim.run().requests[0].token_times

    def first_token(sender: bool, outputs: int) -> float:
        return token_times(sender, outputs)[0]

    # 100 tokens x 1,024 bytes: the sender's 0.5 ms + 102,400 B at 2 GB/s = 0.5512 ms, in the prompt step
    assert first_token(True, 3) - first_token(False, 3) == pytest.approx(0.0005 + 102_400 / 2e9)
    # a one-token request is done on its prompt worker: nothing is sent
    assert first_token(True, 1) == pytest.approx(first_token(False, 1))
    # the link is timed from the sender's first byte to the receiver's last (1 ms + 102,400 B at
    # 1 GB/s = 1.1024 ms): after the step only its rest, 0.5512 ms, so the KV lands at the same time
    # whether the sender's part was timed (and put in the step) or not; the second token follows
    # a 10 ms decode step
    timed, untimed = token_times(True, 3), token_times(False, 3)
    assert timed[1] == pytest.approx(untimed[1]) == pytest.approx(untimed[0] + 0.0011024 + 0.010)


def test_each_term_taken_out_by_hand():
    """The twin's negative controls (MachineProfile.without): each removes one term and no other."""
    m = _machine().under_load(5.0)
    corun = m.without("corun")
    assert corun.timing.step_time(0.1, prompt=False, others_busy=1) == pytest.approx(0.1 + 0.001)   # no co-run, no sharing
    assert corun.timing.step_time(0.1, prompt=False, others_busy=5) == pytest.approx(0.1 + 0.001)
    assert corun.transfer_s(1000) == m.transfer_s(1000) and corun.timing.step_overhead == m.timing.step_overhead
    kv = m.without("kv_transfer")
    assert kv.transfer_s(1000) == 0.0 and kv.send_s(1000) == 0.0
    assert kv.timing.step_time(0.1, prompt=True, others_busy=1) == m.timing.step_time(0.1, prompt=True, others_busy=1)
    path = m.without("path")
    assert (path.timing.step_overhead, path.request_overhead, path.background_s) == (0.0, 0.0, 0.0)
    assert path.under_load(5.0).background_cores == 0.0
    assert path.timing.step_time(0.1, prompt=True, others_busy=1) == pytest.approx(0.1 * 1.1)      # 2 workers, 2 cores
    with pytest.raises(Exception, match="unknown term 'power'"):
        m.without("power")


def test_steps_in_flight_are_re_timed_when_another_worker_starts_or_ends(tmp_path):
    """Processor sharing (sim/sharing.py), by hand: two mixed workers on one core. A prompt step
    of work W starts at 0; an equal one on the other worker at W/2. Both then run at half speed:
    the first ends at W/2 + W = 1.5 W, and the second, with W/2 done by then, at 2 W. Timed once
    at start, the first would end at W and the second at W/2 + 2 W."""
    from splitserve.sim.simulator import SimConfig, Simulation
    from splitserve.twin.machine import load_machine_profile

    m = load_machine_profile(_profile_dir(tmp_path, False, cores=1))

    def first_tokens(arrivals):
        reqs = [SimpleNamespace(arrival=a, prompt_tokens=100, output_tokens=1) for a in arrivals]
        sim = Simulation(m.cluster("baseline"), m.model, reqs, SimConfig(machine=m, record_requests=True))
        res = sim.run()
        return [r.token_times[0] for r in res.requests], res

    (w,), _ = first_tokens([0.0])
    times, res = first_tokens([0.0, w / 2])
    assert times == pytest.approx([1.5 * w, 2.0 * w])
    assert [st.busy_s for st in res.metrics.machines] == pytest.approx([1.5 * w, 1.5 * w])


def test_each_step_draws_its_work_from_the_hosts_spread(tmp_path):
    """MachineProfile.spread: a lone prompt step's work x one of the prompt factors, drawn with the
    step's seeded generator; none: the same work every time."""
    from splitserve.sim.simulator import SimConfig, Simulation
    from splitserve.twin.machine import load_machine_profile

    m = load_machine_profile(_profile_dir(tmp_path, False, cores=1))

    def firsts(host):
        reqs = [SimpleNamespace(arrival=10.0 * i, prompt_tokens=100, output_tokens=1) for i in range(40)]
        res = Simulation(host.cluster("baseline", machines=1), host.model, reqs,
                         SimConfig(machine=host, record_requests=True)).run()
        return [r.token_times[0] - r.arrival for r in res.requests]

    plain = firsts(m)
    assert max(plain) == pytest.approx(min(plain))
    spread = firsts(dataclasses.replace(m, spread=((0.5, 1.5), ())))
    # work w alone, as drawn: 0.5 w or 1.5 w (the step overhead not drawn), both drawn, repeatably
    w, overhead = plain[0] - m.timing.step_overhead, m.timing.step_overhead
    assert sorted({round(t, 9) for t in spread}) == pytest.approx([0.5 * w + overhead, 1.5 * w + overhead])
    assert spread == firsts(dataclasses.replace(m, spread=((0.5, 1.5), ())))


def test_a_split_prompt_waits_for_its_token_machine_between_steps(tmp_path):
    """serve's reservation (sim/reservation.py), by hand on 1P+1T: A (3 tokens) is prefilled and
    decodes on the token machine; B arrives while that machine runs A's first decode step, so the
    idle prompt machine starts B's prompt when the step ends (A's second token), not on arrival; C
    arrives after A is done, with the token machine idle, and starts at once."""
    from splitserve.sim.simulator import SimConfig, Simulation
    from splitserve.twin.machine import load_machine_profile

    m = load_machine_profile(_profile_dir(tmp_path, False))
    reqs = [SimpleNamespace(arrival=a, prompt_tokens=100, output_tokens=n) for a, n in ((0.0, 3), (0.015, 2), (0.2, 2))]
    res = Simulation(m.cluster("splitwise"), m.model, reqs, SimConfig(machine=m, record_requests=True)).run()
    a, b, c = sorted(res.requests, key=lambda r: r.arrival)
    assert a.token_times[0] < b.arrival < a.token_times[1]       # B came during A's first decode step
    assert b.prompt_started_at == pytest.approx(a.token_times[1])
    assert c.prompt_started_at == pytest.approx(c.arrival)


def test_a_busy_prompt_machine_starts_its_next_step_without_a_prompt_still_reserving(tmp_path):
    """serve's reservation on a busy prompt worker, by hand on 1P+1T: A (100 tokens, 3 outputs)
    decodes on the token machine; C (one output: it moves no KV, so nothing to reserve) starts on
    the idle prompt machine during A's first decode step, and X (2 outputs) arrives during C's
    2.6 ms prompt step. C's step ends first, but X's prompt reaches the worker only when the token
    machine answers between steps (A's second token): the prompt machine idles until then, where
    X once started as soon as C's step ended (a live run of 342 such requests: 40 missed a step)."""
    from splitserve.sim.simulator import SimConfig, Simulation
    from splitserve.twin.machine import load_machine_profile

    m = load_machine_profile(_profile_dir(tmp_path, False))
    reqs = [SimpleNamespace(arrival=a, prompt_tokens=p, output_tokens=n)
            for a, p, n in ((0.0, 100, 3), (0.013, 16, 1), (0.014, 16, 2))]
    res = Simulation(m.cluster("splitwise"), m.model, reqs, SimConfig(machine=m, record_requests=True)).run()
    a, c, x = sorted(res.requests, key=lambda r: r.arrival)
    assert a.token_times[0] < c.arrival < x.arrival < c.token_times[0] < a.token_times[1]
    assert c.prompt_started_at == pytest.approx(c.arrival)
    assert c.token_times[0] - c.prompt_started_at == pytest.approx(0.0026 + m.timing.step_overhead)  # 1 ms + 0.1 ms x 16
    assert x.prompt_started_at == pytest.approx(a.token_times[1])  # not c.token_times[0]


def test_the_corun_slowdown_follows_the_steps_beside():
    """A profile that timed each kind of step beside engines running prompt steps of 64 and 512
    tokens, and decode steps of 1 and 8 sequences (corun.py BESIDE): a decode step beside a prompt
    step of 64 tokens +2%, of 512 +9%; beside a decode of 1 sequence +4%, of 8 +32%; prompt steps
    +10% beside any prompt step, +5% beside any decode; on a time-shared core the work grows by 4%
    beside prompts and 8% beside decodes. Between the sizes a straight line, past them the ends."""
    from splitserve.twin.corun import BESIDE_DECODE as D
    from splitserve.twin.corun import BESIDE_PROMPT as P

    def pt(size, prompt, token, grown):
        return {"size": size, "prompt": prompt, "token": token, "same_core": {"prompt": 0.0, "token": grown}}
    beside = {"prompt": [pt(64, 0.10, 0.02, 0.04), pt(512, 0.10, 0.09, 0.04)],
              "decode": [pt(1, 0.05, 0.04, 0.08), pt(8, 0.05, 0.32, 0.08)]}
    m = _machine()
    m = dataclasses.replace(m, facts={**m.facts, "corun": {"prompt": 0.1, "token": 0.32, "beside": beside}})
    # two workers on two cores, no background: the co-run alone
    assert m.timing.step_time(0.1, prompt=False, others_busy=1, beside=((P, 64),)) == pytest.approx(0.101 * 1.02)
    assert m.timing.step_time(0.1, False, 1, beside=((P, 288),)) == pytest.approx(0.101 * 1.055)   # halfway
    assert m.timing.step_time(0.1, False, 1, beside=((P, 16),)) == pytest.approx(0.101 * 1.02)     # below: the end
    assert m.timing.step_time(0.1, False, 1, beside=((D, 1),)) == pytest.approx(0.101 * 1.04)
    assert m.timing.step_time(0.1, False, 1, beside=((D, 3),)) == pytest.approx(0.101 * 1.12)      # 2/7 of the way
    assert m.timing.step_time(0.1, False, 1, beside=((D, 32),)) == pytest.approx(0.101 * 1.32)     # above: the end
    assert m.timing.step_time(0.1, prompt=True, others_busy=1, beside=((D, 8),)) == pytest.approx(0.101 * 1.05)
    # beside two steps: the larger; what runs beside not known: the figure blind to it
    assert m.timing.step_time(0.1, False, 2, beside=((P, 512), (D, 1))) == pytest.approx(0.101 * 1.09 * 1.5)
    assert m.timing.step_time(0.1, False, 1) == pytest.approx(0.101 * 1.32)
    # pinned, sharing its core with one decode of 8: x2 the time-sharing, x1.32 the co-run (the
    # larger of it and the grown work)
    pinned = dataclasses.replace(m, pinned=True)
    assert pinned.timing.step_time(0.1, False, 1, core_busy=2, beside=((D, 8),)) == pytest.approx(0.101 * 1.32 * 2)
    assert pinned.timing.step_time(0.1, False, 1, core_busy=2, beside=((D, 1),)) == pytest.approx(0.101 * 1.08 * 2)
    # without the co-run term: no co-run, no time-sharing
    assert m.without("corun").timing.step_time(0.1, False, 1, beside=((D, 8),)) == pytest.approx(0.101)


def test_a_simulated_decode_beside_a_prompt_runs_at_its_slowdown(tmp_path):
    """HostStep.speed, by hand: worker 1 decodes while worker 0 runs a prompt step of 512 tokens,
    then a decode step of 8 sequences, then a prompt step whose every token a prefix cache gave
    (a decode step of none), then nothing."""
    import json

    from splitserve.policy.machine import Batch
    from splitserve.twin.host_step import HostStep
    from splitserve.twin.machine import load_machine_profile

    d = _profile_dir(tmp_path, False)
    facts = json.loads((d / "machine.json").read_text())
    zero = {"prompt": 0.0, "token": 0.0}
    facts["corun"] = {"prompt": 0.1, "token": 0.3, "beside": {
        "prompt": [{"size": 64, "prompt": 0.1, "token": 0.02, "same_core": zero},
                   {"size": 512, "prompt": 0.1, "token": 0.06, "same_core": zero}],
        "decode": [{"size": 1, "prompt": 0.05, "token": 0.0, "same_core": zero},
                   {"size": 8, "prompt": 0.05, "token": 0.3, "same_core": zero}]}}
    (d / "machine.json").write_text(json.dumps(facts))
    host = load_machine_profile(d)
    machines = [SimpleNamespace(id=0, busy=True), SimpleNamespace(id=1, busy=True)]
    step = HostStep(host, machines)
    decode = Batch(decoding=[SimpleNamespace(prompt_tokens=32, generated=1)], decodes=1, context=33)
    step.work(machines[0], Batch(prompt_tokens=512, chunks=[512]))
    assert step.speed(machines[1], decode) == pytest.approx(1 / 1.06)
    step.work(machines[0], Batch(decoding=[decode.decoding[0]] * 8, decodes=8, context=264))
    assert step.speed(machines[1], decode) == pytest.approx(1 / 1.30)
    step.work(machines[0], Batch(prompt_tokens=100, chunks=[100], cached=100))
    assert step.speed(machines[1], decode) == pytest.approx(1 / 1.0)
    machines[0].busy = False  # alone
    assert step.speed(machines[1], decode) == pytest.approx(1.0)
