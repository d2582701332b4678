"""The twin end to end, short: profile the `small` preset on a reduced grid, run a live Splitwise
1P+1T cluster for 20 s at half the capacity the profile predicts, simulate the same requests,
and hold the simulator to a loose bound on the live P50s and on the workers' engine steps (35%;
benchmarks/twin/ has the full table with the issue's 10% / 20% bounds). The workers' step logs
hold every prompt token once and every decode once. Each profile row is the median of 3 repeats: a
CI run once found the simulated TBT P50 37% above the live one (cause not found), so the profile is
made less sensitive to one disturbed measurement, and a failure prints the path's overheads and the
co-run slowdowns. Seen on the 2-core dev VM on 2026-11-27, before the sender's part of the KV
transfer was put in the prompt step (one profile, three live runs): TBT P50 +3% to +8%, E2E P50
-8% to +3%, TTFT P50 -13% to -24% (the prompt worker's steps ran 1-6% slower than modelled, an
error its queue can multiply); after it (another profile, three runs, and this test once): TBT
P50 -4% to +5% and once +23%, E2E P50 -6% to -18%, TTFT P50 -11% to -21%; each within the bound. The same live run against a
deliberately wrong profile (every step 3x slower) must break the bound, so this test can fail.
The simulation runs at the host's speed measured just before the live run (twin/calibrate.py),
which corrects a profile measured in a slow or a fast moment of the host: a clean-clone CI run of
2026-11-29 at the profile's speed erred TBT P50 +36.5%, past the bound (its cause not recorded)."""

from __future__ import annotations

import csv
import dataclasses
import shutil
from pathlib import Path

from splitserve.policy.cluster import RoutingConfig
from splitserve.policy.config import PolicyConfig
from splitserve.twin.calibrate import calibrated
from splitserve.twin.machine import load_machine_profile
from splitserve.twin.report import compare
from splitserve.twin.run import TwinSpec, loaded, planned, predicted_capacity, run_live, run_sim
from splitserve.twin.steps import compare_steps, read_steps

BOUND = 0.35
P50S = ("TTFT P50 (s)", "TBT P50 (s)", "E2E P50 (s)")


def slowed(src: Path, dst: Path, factor: float) -> Path:
    """A copy of profile `src` whose every measured time is `factor` times the truth."""
    shutil.copytree(src, dst)
    with (src / "profile.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("prompt_time", "token_time", "e2e_time"):
            r[k] = str(float(r[k]) * factor)
    with (dst / "profile.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return dst


def test_the_simulator_predicts_a_short_live_run(profile_dir, tmp_path):
    prof = profile_dir       # tests/twin/conftest.py: `small` on a reduced grid
    machine = load_machine_profile(prof)
    # Half the capacity of the split pair: the profile's capacity under the splitserve borrowing
    # rule (4.99 req/s on the committed profile). Under the authors' rule, the default, overload
    # borrows both machines into the mixed pool and the predicted capacity is that of two mixed
    # machines (7.47 req/s), so half of it loaded the prompt worker to about 75%: the runs of
    # 2026-11-28 whose TTFT P50 erred -27% and -46%. At the same rate the two rules run the same
    # schedule (no borrowing, live or simulated) and err alike (`splitserve twin` on
    # benchmarks/twin/results/profile, 60 s at 3.0 req/s: TTFT P50 -11% and -8%).
    spec = TwinSpec(policy=PolicyConfig(), design="splitwise", workload="coding", rps=1.0, duration=20.0, seed=1,
                    max_prompt_tokens=256, max_tokens_cap=32)
    pair = dataclasses.replace(spec, policy=PolicyConfig(routing=RoutingConfig(borrow_rule="splitserve")))
    spec = dataclasses.replace(spec, rps=0.5 * predicted_capacity(pair, machine))
    machine = calibrated(machine, prof)
    live = run_live(spec, machine, tmp_path / "live", log=lambda m: None)
    assert live["completed"] == live["requests"] > 10 and live["failed"] == 0

    reqs = planned(spec)
    steps = read_steps(tmp_path / "live" / "steps")
    assert sum(s.prompt_tokens for s in steps) == sum(r.prompt_tokens for r in reqs)
    assert sum(s.decodes for s in steps) == sum(r.output_tokens - 1 for r in reqs)  # the first from the prefill
    step_error = compare_steps(steps, loaded(spec, machine, reqs))[-1].error

    sim, _ = run_sim(spec, machine)
    rows = {r.metric: r for r in compare(live, sim)}
    errors = {m: rows[m].rel_error for m in P50S}
    assert sim["completed"] == live["completed"]
    assert live["cluster"]["borrowed_into_mixed_pool"] == sim["cluster"]["borrowed_into_mixed_pool"] == 0
    path = {k: v for k, v in machine.facts["path"].items() if k != "how"}
    path["corun"] = {k: machine.facts["corun"][k] for k in ("prompt", "token")}  # the co-run slowdowns
    seen = {k: (live[k], sim[k]) for k in ("ttft_s", "tbt_s", "e2e_s")}   # (live, sim) on a failure
    assert all(abs(e) <= BOUND for e in errors.values()), (errors, f"engine steps {step_error:+.1%}",
                                                           f"speed {machine.drift}", path, seen)
    assert abs(step_error) <= BOUND, (step_error, path)

    wrong = dataclasses.replace(load_machine_profile(slowed(prof, tmp_path / "wrong", 3.0)), drift=machine.drift)
    sim_wrong, _ = run_sim(spec, wrong)
    wrong_errors = {m: r.rel_error for m, r in ((r.metric, r) for r in compare(live, sim_wrong)) if m in P50S}
    wrong_step_error = compare_steps(steps, loaded(spec, wrong, reqs))[-1].error
    print(f"P50 errors, measured profile: {errors}; 3x wrong profile: {wrong_errors}; "
          f"engine steps: {step_error:+.1%}, wrong profile {wrong_step_error:+.1%}")
    assert any(abs(e) > BOUND for e in wrong_errors.values()), wrong_errors
    assert abs(wrong_step_error) > BOUND, wrong_step_error
