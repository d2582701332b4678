"""scripts/gpu_check.sh, the one GPU check (issue 26 item 7), runs its CPU-possible parts here, so it
cannot rot before the next GPU run: every part ends with a figure or a stated skip in summary.md."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("torch")
pytest.importorskip("zmq")
pytest.importorskip("fastapi")


def sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        if line.startswith("## "):
            cur = line[3:]
            out[cur] = []
        elif cur is not None and line.strip():
            out[cur].append(line)
    return out


@pytest.mark.slow
def test_cpu_quick_run_names_every_part_with_a_figure_or_a_skip(tmp_path):
    out = tmp_path / "check"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_BUDGET_S": "300"}
    env.pop("OUT", None)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", "--quick", "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    parts = sections(summary)
    titles = ["1. machine facts", "2a. engine decode (CUDA graphs)", "2b. engine prefill",
              "2c. profiler tables, B=1 decode step (graph and eager)",
              "2d. decode at serving batches, Triton kernels and torch's", "3. CUDA tests",
              "4. serve TPOT against the engine step", "4b. KV reserved against on demand, requests all at once",
              "4c. offline throughput, ShareGPT-like requests, Triton kernels and torch's",
              "5a. KV exposed time, --transport local",
              "5b. KV exposed time, --transport nccl", "6a. splitserve profile", "6b. splitserve twin (P50 error)"]
    assert list(parts) == titles, summary
    for title, lines in parts.items():
        status = lines[0]
        if status.startswith("status: skipped"):
            assert len(status) > len("status: skipped; "), f"{title}: a skip must say why\n{summary}"
            continue
        assert status.startswith("status: ok"), f"{title}: {status}\n{summary}"
        figures = [x for x in lines[1:] if x.startswith("- ")]
        assert figures and not any("no figure" in x or "could not read" in x for x in figures), f"{title}\n{summary}"
    # the figures are numbers, not placeholders
    assert re.search(r"B=1: [0-9.]+ ms/step", summary)
    assert re.search(r"ratio [0-9.]+ \(target <= 1.15", summary)
    assert re.search(r"local layerwise: exposed P50 [0-9.]+ ms", summary)
    assert re.search(r"on demand / reserve: x[0-9.]+ tokens/s", summary)
    assert re.search(r"B=4 ctx=128: torch [0-9.]+ ms/step \([0-9]+ tok/s\) = [0-9.]+x the [0-9.]+ ms bound", summary)
    assert re.search(r"torch: [0-9]+ output tokens/s, [0-9]+ tokens/s with the prompts", summary)
    assert "skipped; no GPU" in "\n".join(parts["5b. KV exposed time, --transport nccl"])
    assert re.search(r"\d+ skipped", "\n".join(parts["3. CUDA tests"]))
    assert (out / "kernels.txt").read_text().count("top 25 by host (CPU) self time") == 1
    results = json.loads((out / "results.json").read_text())
    assert results["machine"]["device"] == "cpu" and set(results["parts"]) >= {"decode", "serve", "twin"}
    # nothing written into the repository's own benchmark folders
    assert not list((ROOT / "benchmarks" / "engine" / "results").glob("decode.json"))
