"""A day-long run's memory does not grow with its length (issue 44): the same command over 2 h and
8 h of simulated time (a measured rate shape, every request written by --requests-out), each in a
process of its own, peaks at the same resident memory within 10% though the longer one serves
four times the requests."""

import json
import os
import subprocess
import sys

import pytest

ARGS = ["simulate", "--design", "splitwise-hh", "-p", "2", "-t", "1", "--workload", "conversation",
        "--rate-profile", "azure-conv", "--rps", "2", "--quiet", "--json"]


def peak_rss_kb(tmp_path, hours):
    """The command's peak resident memory (KB) and its summary."""
    rows = tmp_path / f"rows_{hours}h.csv"
    with open(tmp_path / f"out_{hours}h.json", "w+") as out, open(tmp_path / f"err_{hours}h", "w+") as err:
        p = subprocess.Popen([sys.executable, "-m", "splitserve.cli", *ARGS, "--duration", str(hours * 3600),
                              "--requests-out", str(rows)], stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        assert p.returncode == 0, err.read()
        out.seek(0)
        summary = json.load(out)
    with rows.open() as f:
        assert sum(1 for _ in f) == summary["requests"] + 1
    return usage.ru_maxrss, summary


@pytest.mark.skipif(not hasattr(os, "wait4"), reason="needs os.wait4 (POSIX)")
def test_memory_does_not_grow_with_the_length_of_the_day(tmp_path):
    short_kb, short = peak_rss_kb(tmp_path, 2)
    long_kb, long = peak_rss_kb(tmp_path, 8)
    assert long["requests"] == pytest.approx(4 * short["requests"], rel=0.05)
    assert long["requests"] > 50_000
    assert long_kb == pytest.approx(short_kb, rel=0.10), (short_kb, long_kb)
