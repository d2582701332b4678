"""Each modelled term of the twin taken out, on the committed live runs (issue 27 item 6): the
P50/P90 errors of TTFT, TBT and E2E with the model as measured and without each term
(twin/machine.py `MachineProfile.without`: corun, kv_transfer, path), and the prompt worker's
live engine steps against the model's time for them, per 10 s of the run (from the step logs).
Nothing runs live: the simulations replay each run's requests on results/profile.

    python benchmarks/twin/ablate.py benchmarks/twin/results
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tarfile
import tempfile
from pathlib import Path

from splitserve.twin.machine import TERMS, load_machine_profile
from splitserve.twin.report import compare
from splitserve.twin.run import TwinSpec, loaded, planned, run_sim
from splitserve.twin.steps import busy_spans, drift, modelled, read_steps

CELLS = [f"{m} P{p} (s)" for m in ("TTFT", "TBT", "E2E") for p in (50, 90)]


def spec_of(run: Path) -> TwinSpec:
    sp = dict(json.loads((run / "twin.json").read_text())["spec"])
    sp.pop("policy")
    return TwinSpec(**sp)


def errors(live: dict, sim: dict) -> str:
    rows = {r.metric: r for r in compare(live, sim)}
    return " | ".join(f"{rows[c].rel_error:+.0%}" for c in CELLS)


def live_steps(run: Path) -> list:
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(run / "live" / "logs.tar.gz") as tar:
        tar.extractall(tmp, filter="data")
        return read_steps(Path(tmp) / "steps")


def prompt_steps(steps: list, spec: TwinSpec, machine) -> str:
    """The prompt-running worker's live step seconds against the model's, per 10 s of the run."""
    mach = loaded(spec, machine, planned(spec))
    mine = [(s, f) for s, f in zip(steps, busy_spans(steps, mach.timing.cores_of)) if s.worker == 0 and s.prompt_tokens]
    t0 = mine[0][0].start
    out = []
    for lo in range(0, int(spec.duration), 10):
        sel = [(s, f) for s, f in mine if lo <= s.start - t0 < lo + 10]
        if sel:
            live = sum(s.seconds for s, _ in sel)
            model = sum(modelled(s, mach, f) for s, f in sel)
            out.append(f"{model / live - 1:+.1%}")
    return ", ".join(out)


def main(root: str) -> None:
    root = Path(root)
    machine = load_machine_profile(root / "profile")
    print("| run | model | " + " | ".join(c.replace(" (s)", "") for c in CELLS) + " |")
    print("|---|---|" + "---:|" * len(CELLS))
    for run in sorted(p.parent for p in root.glob("*/twin.json")):
        spec = spec_of(run)
        live = json.loads((run / "live" / "summary.json").read_text())
        for name, m in [("as measured", machine)] + [(f"without {t}", machine.without(t)) for t in TERMS]:
            print(f"| {run.name} | {name} | {errors(live, run_sim(spec, m)[0])} |")
    print("\nprompt worker's steps, model / live - 1, per 10 s:")
    for run in sorted(p.parent for p in root.glob("splitwise*/twin.json")):
        print(f"- {run.name}: {prompt_steps(live_steps(run), spec_of(run), machine)}")
    print("\nthe simulator given the live steps' own speed (MachineProfile.drift from the step logs):")
    for run in sorted(p.parent for p in root.glob("*/twin.json")):
        spec = spec_of(run)
        d = drift(live_steps(run), loaded(spec, machine, planned(spec)))
        live = json.loads((run / "live" / "summary.json").read_text())
        sim = run_sim(spec, dataclasses.replace(machine, drift=d))[0]
        print(f"| {run.name} | drift {d[0]:.3f} / {d[1]:.3f} | {errors(live, sim)} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/twin/results")
