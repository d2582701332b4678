"""The twin at issue 27's bounds (src/splitserve/twin/bounds.py: the runs, the bounds, the three
speeds and the controls; tests/twin/test_twin_bounds.py is the CI test of the same).

    python benchmarks/twin/bounds.py [--out DIR] [--duration S] [--profile-dir DIR]    # ~6 min
    python benchmarks/twin/bounds.py --model small --num-blocks 0 --runs splitwise        # GQA, KV / 4
    python benchmarks/twin/bounds.py --record benchmarks/twin/recorded/NAME              # for CI

Profiles the CI grid (`small-mha`, ~60 s; or reads --profile-dir), then seven live runs of
`duration` s (default: twin/bounds.DURATION, 20 s Splitwise, 30 s baseline) on this machine, the
host's speed measured through its workers before and after each (--no-calibrate: not).
Keeps each run's server files in DIR/<run>/ (summary.json, requests.jsonl, steps/). Prints,
and writes to DIR/bounds.json, each run's errors at the profile's speed, at the speed
measured before the run and at the run's own, and without each term at the run's speed; then
which cells break the bounds and which runs each control breaks. benchmarks/twin/recorded/README.md
has the recorded sets. With --record DIR, also keeps in DIR the profile and each run's record
(record.json, its workers' step logs gzipped): what tests/twin/test_twin_replay.py judges.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import re
import shutil
from pathlib import Path

from splitserve.twin.bounds import BOUNDS, CI_GRID, DURATION, HELD_AT, LOAD, RUNS, check_run, controls_failing, table
from splitserve.twin.machine import load_machine_profile
from splitserve.twin.profiler import run_profile


def keep(run_dir: Path, dest: Path) -> None:
    """A run's record, small: record.json and its workers' step logs, gzipped."""
    (dest / "steps").mkdir(parents=True, exist_ok=True)
    shutil.copy(run_dir / "record.json", dest / "record.json")
    for f in (run_dir / "steps").glob("worker-*.jsonl"):
        (dest / "steps" / (f.name + ".gz")).write_bytes(gzip.compress(f.read_bytes(), mtime=0))


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
    ap.add_argument("--record", type=Path, default=None,
                    help="keep the profile and each run's record here (small: for CI to replay)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    prof = a.profile_dir or a.out / "profile"
    if a.profile_dir is None:
        run_profile(dataclasses.replace(CI_GRID, model=a.model, num_blocks=a.num_blocks or None), prof)
    result = {}
    for name in [n for n in RUNS if a.runs in n]:
        run_dir = a.out / re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")  # coding-splitwise-1p-1t-prompts-16
        result[name] = check_run(name, load_machine_profile(prof), run_dir, a.duration, a.calibrate)
        print(table({name: result[name]}), flush=True)
        if a.record is not None:
            keep(run_dir, a.record / run_dir.name)
    if a.record is not None:
        (a.record / "profile").mkdir(parents=True, exist_ok=True)
        for f in ("machine.json", "profile.csv"):  # what load_machine_profile reads; not the probes' logs
            shutil.copy(prof / f, a.record / "profile" / f)
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
