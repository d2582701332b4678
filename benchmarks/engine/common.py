"""Shared helpers for the engine benchmarks: machine info, reference peaks, timing, results."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from splitserve.twin.profiler import cpu_model

RESULTS = Path(__file__).parent / "results"

# Datasheet figures (dense bf16 tensor-core FLOP/s, HBM bytes/s), matched on the CUDA device name.
GPU_SPECS = [  # (substring of torch.cuda.get_device_name, bf16 FLOP/s, HBM B/s)
    ("H200", 989e12, 4.8e12),
    ("H100 NVL", 835e12, 3.9e12),
    ("H100 PCIe", 756e12, 2.0e12),
    ("H100", 989e12, 3.35e12),  # SXM5 80GB ("NVIDIA H100 80GB HBM3")
    ("A100-SXM4-80GB", 312e12, 2.039e12),
    ("A100-SXM4-40GB", 312e12, 1.555e12),
    ("A100", 312e12, 1.935e12),  # PCIe 80GB
    ("L40S", 362e12, 0.864e12),
]


def machine_info(device: torch.device) -> dict:
    info = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "device": str(device),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    cuda=torch.version.cuda, sm_count=props.multi_processor_count)
    return info


def gpu_datasheet(device: torch.device) -> tuple[float | None, float | None]:
    name = torch.cuda.get_device_name(device)
    for key, flops, bw in GPU_SPECS:
        if key in name:
            return flops, bw
    return None, None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measured_bandwidth(device: torch.device, nbytes: int = 1 << 30, reps: int = 5) -> float:
    """Bytes/s of a large on-device copy (read + write counted)."""
    nbytes = nbytes if device.type == "cuda" else nbytes // 4
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * nbytes / best


def measured_matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 4096, reps: int = 5) -> float:
    """FLOP/s of the best of a few square matmuls (a practical peak; the CPU has no datasheet here)."""
    n = n if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    sync(device)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def timed(fn, device: torch.device, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t)
    return out


def summary(times: list[float]) -> dict:
    return {"median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times),
            "mean_ms": 1e3 * statistics.fmean(times), "n": len(times)}


def add_threads_arg(ap) -> None:
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")


def apply_threads(n: int | None) -> None:
    if n:
        torch.set_num_threads(n)


def write_result(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def engine_parser(doc: str | None, cpu_model: str = "small") -> argparse.ArgumentParser:
    """A benchmark's parser with --model, --device and --dtype: llama3-8b in bf16 on CUDA where
    there is a GPU, `cpu_model` in float32 on the CPU otherwise."""
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3-8b" if cuda else cpu_model)
    ap.add_argument("--device", default="cuda" if cuda else "cpu")
    ap.add_argument("--dtype", default="bfloat16" if cuda else "float32")
    return ap
