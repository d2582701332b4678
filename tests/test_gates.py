"""The lint gate (ruff, pyproject.toml [tool.ruff]) passes, and neither gate keeps a list of what
does not pass. .ci/run runs ruff and mypy over the package; this runs ruff with the tests too."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff")
    if ruff is None:
        if os.environ.get("CI"):
            pytest.fail("ruff is not installed: pip install '.[test]'")
        pytest.skip("ruff is not installed (the test extra installs it)")
    out = subprocess.run([ruff, "check", "--no-cache", "src", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-1000:]


def test_the_gates_have_no_exception_lists():
    """Every file passes ruff and every module mypy (strict on policy/, sim/, perf/): no per-file
    ignores, no module whose errors mypy ignores or whose strictness it relaxes."""
    assert "per-file-ignores" not in CONFIG["tool"]["ruff"]["lint"]
    relaxed = [o["module"] for o in CONFIG["tool"]["mypy"].get("overrides", [])
               if o.get("ignore_errors") or any(v is False for k, v in o.items() if k.startswith("disallow"))]
    assert relaxed == [], f"mypy relaxed for {relaxed}: type them instead"
