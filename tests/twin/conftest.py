"""The live twin tests' machine: the `small` preset profiled once on a reduced grid (each row the
median of 3 repeats), shared by the tests that run the live cluster against its simulation."""

from __future__ import annotations

import pytest

from splitserve.twin.profiler import ProfileSettings, run_profile


@pytest.fixture(scope="package")
def profile_dir(tmp_path_factory):
    prof = tmp_path_factory.mktemp("twin") / "profile"
    run_profile(ProfileSettings(model="small", prompt_sizes=(16, 64, 256, 512), batch_sizes=(1, 2, 3, 4, 8),
                                context_prompt=256, context_batches=(2, 4), repeats=3, tokens=8), prof)
    return prof
