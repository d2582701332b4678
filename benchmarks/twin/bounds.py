"""The twin at issue 27's bounds (src/splitserve/twin/bounds.py: the runs, the bounds, the three
speeds and the controls; tests/twin/test_twin_bounds.py is the CI test of the same).

    python benchmarks/twin/bounds.py [--out DIR] [--duration S] [--profile-dir DIR]    # ~5 min
    python benchmarks/twin/bounds.py --model small --num-blocks 0 --runs splitwise        # GQA, KV / 4

Profiles the CI grid (`small-mha`, ~60 s; or reads --profile-dir), then five live runs of
`duration` s (default: twin/bounds.DURATION, 20 s Splitwise, 30 s baseline) on this machine, the
host's speed measured before each (--no-calibrate: not).
Keeps each run's server files in DIR/<run>/ (summary.json, requests.jsonl, steps/). Prints,
and writes to DIR/bounds.json, each run's errors at the profile's speed, at the speed
measured before the run and at the run's own, and without each term at the run's speed; then
which cells break the bounds and which runs each control breaks. benchmarks/twin/README.md has
the runs so far.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from splitserve.twin.bounds import BOUNDS, CI_GRID, DURATION, HELD_AT, LOAD, RUNS, check_run, controls_failing, table
from splitserve.twin.machine import load_machine_profile
from splitserve.twin.profiler import run_profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("twin-bounds"))
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds of each run (default: 20 Splitwise, 30 baseline)")
    ap.add_argument("--profile-dir", type=Path, default=None, help="a profile to use (default: measure one)")
    ap.add_argument("--model", default=CI_GRID.model, help="the preset to profile (without --profile-dir)")
    ap.add_argument("--num-blocks", type=int, default=CI_GRID.num_blocks,
                    help="KV blocks of each worker (0: the engine's default)")
    ap.add_argument("--runs", default="", help="only the runs whose name holds this (e.g. splitwise)")
    ap.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                    help="do not measure the host's speed before each run")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    prof = a.profile_dir or a.out / "profile"
    if a.profile_dir is None:
        run_profile(dataclasses.replace(CI_GRID, model=a.model, num_blocks=a.num_blocks or None), prof)
    result = {}
    for name in [n for n in RUNS if a.runs in n]:
        run_dir = a.out / name.replace(", ", "-").replace(" ", "-")
        result[name] = check_run(name, load_machine_profile(prof), prof, run_dir, a.duration, a.calibrate)
        print(table({name: result[name]}), flush=True)
    held = all(not r["broken"][HELD_AT] for r in result.values())
    failing = controls_failing(result)
    print(f"every cell within the bounds at {HELD_AT}: {held}; each control breaks cells the model kept in, "
          f"in: {failing}")
    (a.out / "bounds.json").write_text(json.dumps({"bounds": BOUNDS, "load": LOAD, "duration_s": a.duration or DURATION,
                                                   "profile": load_machine_profile(prof).facts["model"],
                                                   "held_at": HELD_AT, "runs": result, "held": held,
                                                   "controls": failing}, indent=1) + "\n")


if __name__ == "__main__":
    main()
