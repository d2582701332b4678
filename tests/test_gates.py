"""The lint gate (ruff, pyproject.toml [tool.ruff]) passes, and the gates' lists of what does not
pass yet (ruff's per-file ignores, mypy's module overrides) name only files that exist. .ci/run
runs ruff and mypy over the package; this runs ruff with the tests too."""

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


def test_the_lists_of_what_does_not_pass_yet_name_files_that_exist():
    ignored = CONFIG["tool"]["ruff"]["lint"]["per-file-ignores"]
    missing = [p for p in ignored if not (ROOT / p).exists()]
    for override in CONFIG["tool"]["mypy"]["overrides"]:
        for module in override["module"]:
            if module.endswith(".*"):
                continue
            path = ROOT / "src" / Path(*module.split("."))
            if not (path.with_suffix(".py").exists() or (path / "__init__.py").exists()):
                missing.append(module)
    assert missing == [], f"remove from pyproject.toml (gone): {missing}"
