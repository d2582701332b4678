"""The compiled simulator (setup.py: `pip install .` compiles its hot path with mypyc) gives the
pure-Python simulator's results event for event: benchmarks/identical.py runs its cases (the seven
serving systems on the coding and conversation workloads, every machine-level scheduler, the
Splitwise profile, a pipelined, a mixed-hardware, a chunked and two measured-machine clusters)
with the installed, compiled package and with the checkout's sources (PYTHONPATH=src, pure
Python), and every summary.json must be equal but for the keys that time the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from splitserve.sim import simulator

ROOT = Path(__file__).resolve().parents[2]
IDENTICAL = ROOT / "benchmarks" / "identical.py"


def hot_path(env: dict) -> str:
    out = subprocess.run([sys.executable, "-m", "splitserve.cli", "--version"], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return out.rsplit("hot path: ", 1)[1].strip().rstrip(")")


@pytest.mark.skipif(simulator.__file__.endswith(".py") and os.environ.get("SPLITSERVE_REQUIRE_COMPILED") != "1",
                    reason="this install is pure Python (`pip install .` compiles the hot path; an editable "
                           "install does not)")
def test_compiled_and_pure_python_simulate_alike(tmp_path):
    compiled = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    pure = {**compiled, "PYTHONPATH": str(ROOT / "src")}
    assert hot_path(compiled) == "compiled with mypyc" and hot_path(pure) == "pure Python"
    runs = {name: subprocess.Popen([sys.executable, str(IDENTICAL), "run", "--out", str(tmp_path / name)], env=env,
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name, env in (("compiled", compiled), ("pure", pure))}  # at once: CI has two cores
    for name, proc in runs.items():
        out, err = proc.communicate()
        ran = out.splitlines()
        assert proc.returncode == 0 and len(ran) > 20 and all(line.endswith(" rc=0") for line in ran), (name, ran, err)
    done = subprocess.run([sys.executable, str(IDENTICAL), "diff", str(tmp_path / "compiled"), str(tmp_path / "pure")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
    assert " 0 differ" in done.stdout and not done.stdout.startswith("0 files"), done.stdout
