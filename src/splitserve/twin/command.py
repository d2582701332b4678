"""`splitserve twin` as a function: the live run and the simulation of one TwinSpec, compared and
written (report.md, cdf.png, twin.json, live/, sim/)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from .machine import TERMS, MachineProfile
from .report import ablation_markdown, compare, write_report
from .report import samples_from_requests_jsonl as live_samples
from .run import TwinSpec, loaded, planned, run_live, run_sim, spec_dict
from .calibrate import between, through_workers, window_speed
from .steps import compare_steps, read_steps, run_speed, steps_markdown


def run_twin(spec: TwinSpec, machine: MachineProfile, capacity: float, profile_dir: Path, out: Path,
             log: Callable[[str], None], calibrate: bool = True) -> tuple[list, list, Path]:
    """Serve and replay `spec` live on this machine, simulate it on the measured `machine`, and
    write the side-by-side report; returns (latency rows, engine-step rows, the report's path).
    `capacity`: the rate the profile predicts the cluster carries (req/s). `calibrate`: the
    machine simulated at the speed the workers showed on the run's own shapes right before the
    bench (calibrate.through_workers), else at `machine`'s."""
    live = run_live(spec, machine, out / "live", log=log, calibrate=through_workers(spec) if calibrate else None)
    steps = read_steps(out / "live" / "steps")
    machine = at_workers_speed(spec, machine, steps, live.get("calibration", {}), log)
    steps = between(steps, live.get("calibration", {}))
    sim, sim_samples = run_sim(spec, machine)
    (out / "sim").mkdir(parents=True, exist_ok=True)
    (out / "sim" / "summary.json").write_text(json.dumps(sim, indent=1) + "\n")
    rows = compare(live, sim)
    under = loaded(spec, machine, planned(spec))
    variants = {f"without {t}": compare(live, run_sim(spec, machine.without(t))[0]) for t in TERMS}
    own = run_speed(steps, machine, under).drift  # the run's lone steps' speed against the profile's
    log(f"the host's speed: {speed_line(machine.drift, own)}")
    variants[f"with the run's own speed (x{own[0]:.3f} prompt, x{own[1]:.3f} decode)"] = \
        compare(live, run_sim(spec, dataclasses.replace(machine, drift=own))[0])
    step_rows = compare_steps(steps, under)
    meta = {"design": f"{spec.design} {spec.workers()}", "model": machine.facts["model"], "machine": machine.name,
            "workload": f"{spec.workload}, {spec.rps:.3g} req/s ({spec.rps / capacity:.0%} of the predicted "
                        f"{capacity:.3g}), {spec.duration:g} s, seed {spec.seed}, prompts <= "
                        f"{spec.max_prompt_tokens}, outputs <= {spec.max_tokens_cap}",
            "profile": str(profile_dir), "transport": spec.transport,
            "speed": speed_line(machine.drift, own)}
    report = write_report(out, rows, title=f"Twin: {spec.design} {spec.workers()} on {machine.name}", meta=meta,
                          live_samples=live_samples(out / "live" / "requests.jsonl"), sim_samples=sim_samples,
                          steps=steps_markdown(step_rows) if step_rows else "",
                          ablation=ablation_markdown(rows, variants))
    (out / "twin.json").write_text(json.dumps({"spec": spec_dict(spec), "capacity_rps": capacity, "meta": meta,
                                               "rows": [dataclasses.asdict(r) for r in rows],
                                               "variants": {t: [dataclasses.asdict(r) for r in rs]
                                                            for t, rs in variants.items()},
                                               "live_server": live.get("server", {}),
                                               "steps": [dataclasses.asdict(r) for r in step_rows]}, indent=1) + "\n")
    return rows, step_rows, report


def at_workers_speed(spec: TwinSpec, machine: MachineProfile, steps: list, windows: dict,
                     log: Callable[[str], None]) -> MachineProfile:
    """`machine` at the speed its workers ran the run's own shapes in the calibration before the
    bench (calibrate.window_speed), or as it is without one."""
    plain = dataclasses.replace(machine, drift=(1.0, 1.0))
    before = window_speed(steps, plain, loaded(spec, plain, planned(spec)), windows.get("before"))
    if before is None:
        return machine
    log(f"the workers ran the run's own shapes at x{before[0]:.3f} (prompt) and x{before[1]:.3f} (decode) "
        "the profile's time right before the bench")
    return dataclasses.replace(machine, drift=before)


def speed_line(before: tuple[float, float], own: tuple[float, float]) -> str:
    """The host's speed the table is simulated at (measured before the run) and the run's own
    (its lone steps), against the profile, and the drift between them: how much of an error the
    host's speed, not the model, can explain."""
    return (f"simulated at x{before[0]:.3f} prompt, x{before[1]:.3f} decode steps against the profile (measured "
            f"before the run); the run's own lone steps ran at x{own[0]:.3f} and x{own[1]:.3f}: the host drifted "
            f"{own[0] / before[0] - 1:+.1%} (prompt) and {own[1] / before[1] - 1:+.1%} (decode) during the run "
            "(the ablation's \"with the run's own speed\" row is the table at that speed)")
