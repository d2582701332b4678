"""The live twin tests' machine: the CI grid of twin/bounds.py (`small-mha`, each row the median
of 3 repeats), profiled once and shared by the tests that run the live cluster against its
simulation."""

from __future__ import annotations

import pytest

from splitserve.twin.bounds import CI_GRID
from splitserve.twin.profiler import run_profile


@pytest.fixture(scope="package")
def profile_dir(tmp_path_factory):
    prof = tmp_path_factory.mktemp("twin") / "profile"
    run_profile(CI_GRID, prof)
    return prof
