"""The twin on conversations, short: the live 1P+1T cluster with prefix caches (and prefix-aware
routing) against the simulator's model of them (sim/prefix.py), on 3-turn conversations whose
later prompts carry their history. The hit rate live (each response's cached_tokens) and
simulated must agree within 5 points, and the simulator with caches must come nearer the live
TTFT P50 than the simulator without them (here -14% and -20% in two runs on the 2-core dev VM,
without caches +92% and +96%): caching is what the prediction rests on, so this test can fail.
The workers run where the OS puts them (`pin_workers=False`), the condition those figures were
measured in: pinned beside the router and the client on 2 cores, one CI run put the live TTFT
P50 at 0.141 s, with caches -27.6% and without +21.8%. The accuracy itself is held to the
issue's bounds on recorded multi-turn runs, pinned (test_twin_replay.py), where a slow or busy
host cannot move it."""

from __future__ import annotations

import dataclasses

from splitserve.policy.config import PolicyConfig
from splitserve.twin.machine import load_machine_profile
from splitserve.twin.report import compare
from splitserve.twin.run import TwinSpec, run_live, run_sim

SHAPE = "turns=3,user=96:160,reply=8:16,think=0.3"


def test_the_simulator_predicts_conversations_with_prefix_caches(profile_dir, tmp_path):
    machine = load_machine_profile(profile_dir)     # tests/twin/conftest.py
    spec = TwinSpec(policy=PolicyConfig(), design="splitwise", workload="multiturn", conversation=SHAPE,
                    rps=3.0, duration=8.0, seed=2, pin_workers=False)
    live = run_live(spec, machine, tmp_path / "live", log=lambda m: None)
    assert live["completed"] == live["requests"] >= 12 and live["failed"] == 0
    sim, _ = run_sim(spec, machine)
    assert sim["requests"] == live["requests"]                 # the same turns, closed loop
    hit_live, hit_sim = live["prefix_cache"]["hit_rate"], sim["prefix_cache"]["hit_rate"]
    assert hit_live > 0.4 and abs(hit_sim - hit_live) <= 0.05, (hit_live, hit_sim)
    ttft = {r.metric: r for r in compare(live, sim)}["TTFT P50 (s)"].rel_error
    no_cache, _ = run_sim(dataclasses.replace(spec, prefix_caching=False), machine)
    wrong = {r.metric: r for r in compare(live, no_cache)}["TTFT P50 (s)"].rel_error
    print(f"hit rate live {hit_live:.3f}, simulated {hit_sim:.3f}; TTFT P50 error {ttft:+.1%}, "
          f"simulated without caches {wrong:+.1%}")
    assert abs(ttft) < abs(wrong), (ttft, wrong, live["ttft_s"], sim["ttft_s"])
