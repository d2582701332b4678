"""The accuracy table of benchmarks/twin/run_table.sh: one line per (design, load), the relative
error of P50 and P90 of TTFT, TBT and E2E (bounds: 10% and 20%), and of the workers' engine
steps (the model's seconds for the live steps' shapes, twin/steps.py), from each run's twin.json.

    python benchmarks/twin/table.py benchmarks/twin/results
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CELLS = [f"{m} P{p} (s)" for m in ("TTFT", "TBT", "E2E") for p in (50, 90)]


def main(root: str) -> None:
    print("| design | load | req/s | completed live / sim | " + " | ".join(c.replace(" (s)", "") for c in CELLS) +
          " | engine steps live / model s |")
    print("|---|---:|---:|---:|" + "---:|" * (len(CELLS) + 1))
    for run in sorted(Path(root).glob("*/twin.json")):
        t = json.loads(run.read_text())
        rows = {r["metric"]: r for r in t["rows"]}
        spec = t["spec"]
        design = f"splitwise {spec['prompt']}P+{spec['token']}T" if spec["design"] == "splitwise" else \
            f"baseline {spec['machines']} mixed"
        cells = []
        for c in CELLS:
            r = rows[c]
            mark = "" if r["ok"] else " ✗"
            cells.append(f"{r['live']:.3f} / {r['sim']:.3f} ({r['rel_error']:+.0%}){mark}")
        done = rows["completed"]
        steps = t.get("steps") or [{}]
        s = steps[-1]
        cells.append(f"{s['live_s']:.1f} / {s['model_s']:.1f} ({(s['model_s'] - s['live_s']) / s['live_s']:+.0%})"
                     if s else "n/a")
        print(f"| {design} | {spec['rps'] / t['capacity_rps']:.0%} | {spec['rps']:.2f} | "
              f"{done['live']:.0f} / {done['sim']:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/twin/results")
