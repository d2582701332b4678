"""The build: the simulator's hot path (HOT) compiled with mypyc where it can be, else pure Python.

`pip install .` type-checks HOT with mypyc and compiles it to one C extension; the same Python
sources are installed beside it and run wherever the extension is not built: an editable install
(`pip install -e .`, so an edited module is never shadowed by a stale compiled one), a machine
without a C compiler or Python headers (the build says so and goes on), or
SPLITSERVE_PURE_PYTHON=1. `splitserve --version` says which is installed. Both give the same
results event for event (tests/sim/test_compiled.py). With SPLITSERVE_REQUIRE_COMPILED=1 (CI:
.ci/run) a hot path that does not compile fails the install instead.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

HOT = ["src/splitserve/report/histogram.py", "src/splitserve/sim/metrics.py", "src/splitserve/policy/state.py",
       "src/splitserve/policy/transitions.py", "src/splitserve/policy/machine.py",
       "src/splitserve/policy/kv_allocation.py", "src/splitserve/policy/preemption.py",
       "src/splitserve/sim/simulator.py", "src/splitserve/sim/handoff.py", "src/splitserve/sim/stages.py",
       "src/splitserve/sim/prefix.py", "src/splitserve/policy/prefix_routing.py",
       "src/splitserve/sim/sharing.py", "src/splitserve/sim/reservation.py", "src/splitserve/sim/state.py",
       # the default rule's path (issue 44): step model, perf and power models, pools and admission
       "src/splitserve/perf/mixed.py", "src/splitserve/perf/roofline.py", "src/splitserve/perf/step.py",
       "src/splitserve/perf/power.py", "src/splitserve/perf/profile.py", "src/splitserve/perf/decode_lookup.py",
       "src/splitserve/perf/operator_perf.py", "src/splitserve/policy/cluster.py", "src/splitserve/policy/pools.py",
       "src/splitserve/policy/kv_transfer.py", "src/splitserve/policy/instance_flip.py",
       "src/splitserve/policy/aladdin.py", "src/splitserve/sim/kv_transfer.py"]


REQUIRED = os.environ.get("SPLITSERVE_REQUIRE_COMPILED") == "1"


def fall_back(msg: str) -> None:
    """Say why the hot path stays pure Python; with SPLITSERVE_REQUIRE_COMPILED=1, fail instead."""
    if REQUIRED:
        raise SystemExit(f"splitserve: {msg}, and SPLITSERVE_REQUIRE_COMPILED=1")
    print(f"splitserve: {msg}; installing pure Python", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext that installs pure Python when the C compiler fails: all of HOT or none of it (a
    module's compiled shim without the shared library would not import)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # no compiler, no headers: distutils' errors vary by platform
            for ext in self.extensions:
                built = self.get_ext_fullpath(ext.name)
                if os.path.exists(built):
                    os.remove(built)
            fall_back(f"could not compile the simulator's hot path ({e})")


def ext_modules() -> list:
    editable = any(cmd in sys.argv for cmd in ("editable_wheel", "develop"))
    if os.environ.get("SPLITSERVE_PURE_PYTHON") or editable:
        if REQUIRED:
            fall_back("SPLITSERVE_PURE_PYTHON or an editable install keeps the hot path pure Python")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        fall_back("mypyc is not installed")
        return []
    try:   # mypyc's own checks, not pyproject's [tool.mypy] (the type gate's strictness)
        return mypycify(["--config-file", "", "--ignore-missing-imports", "--follow-imports=silent", *HOT], opt_level="3")
    except BaseException as e:  # mypyc exits on a type error
        fall_back(f"mypyc could not compile the hot path ({e!r})")
        return []


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
