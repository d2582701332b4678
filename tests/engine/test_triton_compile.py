"""The Triton kernels compile for the GPUs the catalog serves on (sm_90: H100, H200; sm_80: A100),
ahead of time on this machine, GPU or not: Triton's own compiler down to a cubin with the ptxas
its wheel bundles (triton_compile_check.py, in a process of its own). Types, tile shapes,
`tl.dot` operands and shared memory, which the interpreter tests do not see, fail here before a
GPU is lent. What the kernels compute is test_triton_attention.py's and test_triton_fused.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed: the Triton kernels are not compiled here")

HERE = Path(__file__).parent
SMEM = {80: 163 * 1024, 90: 227 * 1024}  # shared memory a block may use: A100, H100/H200
KERNELS = {"decode", "reduce", "prefill", "rms_norm", "rotary", "silu_mul", "write_kv"}


def test_every_kernel_compiles_to_a_cubin_for_sm90_and_sm80():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1] / "src"), os.environ.get("PYTHONPATH", "")]),
           "TRITON_DEFAULT_FP_FUSION": "1"}
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, str(HERE / "triton_compile_check.py"), "90", "bf16", "90", "fp32", "80", "bf16"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = [line.split() for line in r.stdout.splitlines()]
    assert {(n, int(a), d) for n, a, d, _ in rows} == {(n, a, d) for n in KERNELS
                                                       for a, d in ((90, "bf16"), (90, "fp32"), (80, "bf16"))}
    for name, arch, dt, shared in rows:
        assert shared.isdigit() and int(shared) <= SMEM[int(arch)], f"{name} sm_{arch} {dt}: shared memory {shared}"
