"""A day of traffic, whole commands (issue 44, items 3 and 4): `splitserve simulate` over 24 h of a
measured rate shape at a 70 req/s mean, start to exit, its wall time, CPU time and peak RSS.

    python benchmarks/day_speed.py [--cases diurnal-day,...] [--core N] [--out benchmarks/results/day_speed.json]

Each case is one `python -m splitserve.cli simulate ...` process (pinned to --core with taskset
where there is one), measured by os.wait4: wall clock, user + system CPU, peak resident memory.
Whatever `splitserve` the interpreter imports runs (PYTHONPATH decides: an install compiled with
mypyc, or src/ as pure Python); the record says which, with the machine, its load average before
and after each case (other people's work on a shared VM slows a case down), and the commit.

Cases (Splitwise-HH 35P+5T, llama2-70b, coding, seed 0, the Splitwise authors' profile when
../shared is present):
  diurnal-day        --rate-profile azure-code --rps 70 --duration 86400: the Azure 2023 code trace's
                     hour, per minute, repeated over the day (workload/shape.py), mean 70 req/s
  diurnal-day-rows   the same, with --requests-out (a CSV row per request, streamed)
  constant-day       --rps 70 --duration 86400: the Poisson day at a constant rate, for comparison
  diurnal-hour       --rate-profile azure-code --rps 70 --duration 3600
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from splitserve.twin.profiler import cpu_model

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT.parent / "shared" / "profiles" / "splitwise_a100_h100_perf_model.csv"
BASE = ["simulate", "--design", "splitwise-hh", "-p", "35", "-t", "5", "--model", "llama2-70b", "--workload",
        "coding", "--seed", "0", "--quiet", "--json"]
CASES = {
    "diurnal-day": ["--rate-profile", "azure-code", "--rps", "70", "--duration", "86400"],
    "diurnal-day-rows": ["--rate-profile", "azure-code", "--rps", "70", "--duration", "86400", "--requests-out", "ROWS"],
    "constant-day": ["--rps", "70", "--duration", "86400"],
    "diurnal-hour": ["--rate-profile", "azure-code", "--rps", "70", "--duration", "3600"],
}


def hot_path() -> str:
    out = subprocess.run([sys.executable, "-c", "import splitserve.sim as s; print(s.compiled())"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return "compiled with mypyc" if out == "True" else "pure Python"


def run_case(name: str, core: int | None, tmp: Path) -> dict:
    """One whole command: its figures and the summary's."""
    rows = tmp / f"{name}.csv"
    args = [str(rows) if a == "ROWS" else a for a in CASES[name]]
    if PROFILE.exists():
        args += ["--profile", str(PROFILE)]
    cmd = [sys.executable, "-m", "splitserve.cli", *BASE, *args]
    pin = ["taskset", "-c", str(core)] if core is not None and shutil.which("taskset") else []
    load0 = os.getloadavg()
    with open(tmp / "out.json", "w+") as out, open(tmp / "err.txt", "w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(pin + cmd, stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{name}: exit {p.returncode}: {err.read()[-2000:]}")
        out.seek(0)
        s = json.load(out)
    shown = [a if a != str(rows) else "day.csv" for a in args]
    rec = {"case": name, "command": " ".join(["splitserve", *BASE, *shown]).replace(str(ROOT.parent), ".."),
           "wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
           "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "requests": s["requests"], "completed": s["completed"],
           "events": s["sim"]["events"], "sim_wall_s": round(s["sim"]["wall_s"], 2),
           "offered_rps": s["offered_rps"], "ttft_p50_s": s["ttft_s"]["p50"], "ttft_p99_s": s["ttft_s"]["p99"],
           "tbt_p50_s": s["tbt_s"]["p50"], "e2e_p99_s": s["e2e_s"]["p99"], "slo_met": s["slo"]["met"],
           "perf_model": s["sim"]["perf_model"], "load_avg_before": [round(x, 2) for x in load0],
           "load_avg_after": [round(x, 2) for x in os.getloadavg()], "pinned_core": core if pin else None}
    if rows.exists():
        rec["rows_file_mb"] = round(rows.stat().st_size / 2**20, 1)
        rows.unlink()
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="diurnal-day,diurnal-day-rows", help=f"comma-separated: {', '.join(CASES)}")
    ap.add_argument("--core", type=int, default=(os.cpu_count() or 1) - 1, help="pin each case to this core (-1: no pin)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "day_speed.json")
    a = ap.parse_args()
    names = [c.strip() for c in a.cases.split(",") if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    package = subprocess.run([sys.executable, "-c", "import splitserve; print(splitserve.__file__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
               "platform": platform.platform(), "hot_path": hot_path(), "package": package,
               "repository_head": commit,
               "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(machine), flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in names:
            results.append(run_case(n, a.core if a.core >= 0 else None, Path(tmp)))
            print(json.dumps(results[-1]), flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"machine": machine, "results": results}, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
