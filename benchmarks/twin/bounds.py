"""The twin at issue 27's bounds: every P50 of TTFT, TBT and E2E within 15% of the live run, every
P90 within 25%, on the coding and the conversation workload and both designs, with each modelled
term taken out as a negative control.

    python benchmarks/twin/bounds.py [--out DIR] [--duration 20] [--profile-dir DIR]    # ~4 min
    python benchmarks/twin/bounds.py --model small-mha --num-blocks 2048 --runs splitwise  # KV 4x

Profiles the `small` preset on the CI grid (tests/twin/conftest.py's settings, ~60 s; or reads
--profile-dir), then four live runs of `duration` s on this machine: Splitwise 1P+1T and the unsplit
baseline with 4 mixed workers (more busy workers than the 2 cores of CI: the cores' time-sharing
is a large term), each at 35% of the capacity the profile predicts (Splitwise: of the split pair,
under the splitserve borrowing rule), prompts <= 256 and outputs <= 32 tokens, seed 1. Before each
run the host's speed is measured (twin/calibrate.py). Prints, and writes to DIR/bounds.json, each
run's errors simulated at that speed ("as measured"), at the profile's, and with each term taken
out, then which cells break the bounds (a control counts where it breaks a cell the model as
measured kept inside). benchmarks/twin/README.md has the runs so far.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

from splitserve.policy.cluster import RoutingConfig
from splitserve.policy.config import PolicyConfig
from splitserve.twin.calibrate import calibrated
from splitserve.twin.machine import TERMS, load_machine_profile
from splitserve.twin.profiler import ProfileSettings, run_profile
from splitserve.twin.report import compare
from splitserve.twin.run import TwinSpec, predicted_capacity, run_live, run_sim

BOUNDS = {"TTFT P50 (s)": 0.15, "TBT P50 (s)": 0.15, "E2E P50 (s)": 0.15,
          "TTFT P90 (s)": 0.25, "TBT P90 (s)": 0.25, "E2E P90 (s)": 0.25}
RUNS = {"coding, splitwise 1P+1T": ("splitwise", "coding", 2), "coding, baseline 4 mixed": ("baseline", "coding", 4),
        "conversation, splitwise 1P+1T": ("splitwise", "conversation", 2),
        "conversation, baseline 4 mixed": ("baseline", "conversation", 4)}
LOAD = 0.35
CI_GRID = ProfileSettings(model="small", prompt_sizes=(16, 64, 256, 512), batch_sizes=(1, 2, 3, 4, 8),
                          context_prompt=256, context_batches=(2, 4), repeats=3, tokens=8)


def errors(live: dict, sim: dict) -> dict[str, float]:
    return {r.metric: r.rel_error for r in compare(live, sim) if r.metric in BOUNDS}


def spec_of(name: str, machine, duration: float) -> TwinSpec:
    design, workload, workers = RUNS[name]
    spec = TwinSpec(policy=PolicyConfig(), design=design, workload=workload, machines=workers, duration=duration,
                    seed=1, max_prompt_tokens=256, max_tokens_cap=32)
    pair = dataclasses.replace(spec, policy=PolicyConfig(routing=RoutingConfig(borrow_rule="splitserve")))
    return dataclasses.replace(spec, rps=LOAD * predicted_capacity(pair if design == "splitwise" else spec, machine))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("twin-bounds"))
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--profile-dir", type=Path, default=None, help="a profile to use (default: measure one)")
    ap.add_argument("--model", default="small", help="the preset to profile (without --profile-dir)")
    ap.add_argument("--num-blocks", type=int, default=None, help="KV blocks of each worker (the profile's)")
    ap.add_argument("--runs", default="", help="only the runs whose name holds this (e.g. splitwise)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    prof = a.profile_dir or a.out / "profile"
    if a.profile_dir is None:
        run_profile(dataclasses.replace(CI_GRID, model=a.model, num_blocks=a.num_blocks), prof)
    result = {}
    for name in [n for n in RUNS if a.runs in n]:
        spec = spec_of(name, load_machine_profile(prof), a.duration)
        machine = calibrated(load_machine_profile(prof), prof)
        with tempfile.TemporaryDirectory() as tmp:
            live = run_live(spec, machine, Path(tmp), log=lambda m: None)
        models = {"as measured": machine, "profile's speed": dataclasses.replace(machine, drift=(1.0, 1.0))}
        models.update({f"without {t}": machine.without(t) for t in TERMS})
        rows = {label: errors(live, run_sim(spec, m)[0]) for label, m in models.items()}
        result[name] = {"rps": spec.rps, "requests": live["requests"], "failed": live["failed"],
                        "speed": list(machine.drift), "errors": rows,
                        "broken": {label: [k for k, e in r.items() if abs(e) > BOUNDS[k]] for label, r in rows.items()}}
        print(f"{name}: {spec.rps:.2f} req/s, {live['requests']} requests, speed x{machine.drift[0]:.3f} prompt, "
              f"x{machine.drift[1]:.3f} decode", flush=True)
        for label, r in rows.items():
            print(f"  {label:20s} " + " ".join(f"{k.split(' (')[0]} {e:+6.1%}" for k, e in r.items()), flush=True)
    held = all(not r["broken"]["as measured"] for r in result.values())
    # a control breaks a run where it puts a cell out of the bounds that the model as measured kept in
    failing = {t: [n for n, r in result.items() if set(r["broken"][f"without {t}"]) - set(r["broken"]["as measured"])]
               for t in TERMS}
    print(f"every cell within the bounds: {held}; each control breaks cells the model kept in, in: {failing}")
    (a.out / "bounds.json").write_text(json.dumps({"bounds": BOUNDS, "load": LOAD, "duration_s": a.duration,
                                                   "profile": load_machine_profile(prof).facts["model"],
                                                   "runs": result, "held": held, "controls": failing}, indent=1) + "\n")


if __name__ == "__main__":
    main()
