"""A recorded set's table for benchmarks/twin/recorded/README.md: each run's speeds (calibrated
before it, after it, its own lone steps') and its errors at the run's speed, before it and around
it, with ✗ on cells outside the bounds; then the step table of benchmarks/twin/beside.py for the
decode steps of each run.

    python benchmarks/twin/recorded_table.py benchmarks/twin/recorded/<set>
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from splitserve.twin.bounds import AROUND, BOUNDS, HELD_AT, judge_run
from splitserve.twin.machine import load_machine_profile

LABELS = {HELD_AT: "the run's speed", "the speed before the run": "before the run", AROUND: "around the run"}


def speed(x) -> str:
    return "-" if x is None else f"x{x[0]:.3f}, x{x[1]:.3f}"


def rows(run: Path, machine) -> list[str]:
    rec, r = json.loads((run / "record.json").read_text()), judge_run(run, machine)
    out = []
    for i, (label, short) in enumerate(LABELS.items()):
        if label not in r["errors"]:
            continue
        errs = r["errors"][label]
        cells = " | ".join(f"{errs[k]:+.1%}" + (" ✗" if abs(errs[k]) > b else "") for k, b in BOUNDS.items())
        head = (f"| {rec['name']} | {r['rps']:.2f} | {r['requests']} | {speed(rec['before'])} | {speed(rec.get('after'))}"
                f" | {speed(r['speed'][HELD_AT])}") if i == 0 else "| | | | | |"
        out.append(f"{head} | {short} | {cells} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("set", type=Path)
    d = ap.parse_args().set
    machine = load_machine_profile(d / "profile")
    print("| run | req/s | requests | speed before the run (prompt, decode) | after it | the run's own | at | "
          + " | ".join(k.replace(" (s)", "") for k in BOUNDS) + " |")
    print("|---|---:|---:|---|---|---|---|" + "---:|" * len(BOUNDS))
    for run in sorted(p for p in d.iterdir() if (p / "record.json").exists()):
        print("\n".join(rows(run, machine)))


if __name__ == "__main__":
    main()
