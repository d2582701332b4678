"""The twin on conversations, short: the live 1P+1T cluster with prefix caches (and prefix-aware
routing) against the simulator's model of them (sim/prefix.py), on 3-turn conversations whose
later prompts carry their history. The hit rate live (each response's cached_tokens) and
simulated must agree within 5 points, and the simulator with caches must come nearer the live
TTFT P50 than the simulator without them: caching is what the prediction rests on, so this test
can fail.

Both simulations run at the run's own host speed (steps.run_speed: the live lone steps' seconds
over the model's, one scalar per phase), as test_twin_bounds.py judges its live runs: a CI host
slower or busier than the one the profile was taken on moves the live TTFT, not the model. At the
profile's speed one CI run put the live TTFT P50 at 0.197 s, with caches -41.4%, without +36.2%,
and failed; the accuracy itself is held to the issue's bounds on recorded multi-turn runs
(test_twin_replay.py), where no host can move it. The workers run where the OS puts them
(`pin_workers=False`)."""

from __future__ import annotations

import dataclasses

from splitserve.policy.config import PolicyConfig
from splitserve.twin.machine import load_machine_profile
from splitserve.twin.report import compare
from splitserve.twin.run import TwinSpec, loaded, planned, run_live, run_sim
from splitserve.twin.steps import read_steps, run_speed

SHAPE = "turns=3,user=96:160,reply=8:16,think=0.3"


def ttft_error(live: dict, spec: TwinSpec, machine) -> float:
    sim, _ = run_sim(spec, machine)
    return {r.metric: r for r in compare(live, sim)}["TTFT P50 (s)"].rel_error


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
    held = run_speed(read_steps(tmp_path / "live" / "steps"), machine, loaded(spec, machine, planned(spec)))
    ttft = ttft_error(live, spec, held)
    wrong = ttft_error(live, dataclasses.replace(spec, prefix_caching=False), held)
    print(f"hit rate live {hit_live:.3f}, simulated {hit_sim:.3f}; at the run's speed x{held.drift[0]:.3f} "
          f"prompt, x{held.drift[1]:.3f} decode: TTFT P50 error {ttft:+.1%}, without caches {wrong:+.1%}")
    assert abs(ttft) < abs(wrong), (ttft, wrong, live["ttft_s"])
