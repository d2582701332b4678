"""The engine parts of scripts/gpu_check.sh: decode and prefill (benchmarks/engine's own scripts,
their results written into the check's folder), and a torch.profiler table of one B=1 decode step,
replayed from a CUDA graph and eager, so a step far above its bandwidth bound says where it goes.

    python scripts/gpu_check_engine.py decode  --dir DIR [--device cuda --model llama3-8b ...]
    python scripts/gpu_check_engine.py prefill --dir DIR ...
    python scripts/gpu_check_engine.py kernels --dir DIR ...
    python scripts/gpu_check_engine.py batches --dir DIR --grid 64x1024,1x4096 --kernels triton,torch ...
    python scripts/gpu_check_engine.py throughput --dir DIR --requests 512 --kernels triton,torch ...

Writes DIR/decode.json, DIR/prefill.json, DIR/kernels.json and DIR/kernels.txt (and on CUDA
DIR/trace_graph.json and DIR/trace_eager.json, Chrome traces of the profiled steps),
DIR/batches.json (benchmarks/engine/bench_batches.py: decode at serving batches and contexts,
Triton kernels on and off) and DIR/throughput.json (bench_throughput.py: offline tokens/s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks" / "engine"))


def _bench(module: str, out_dir: Path, argv: list[str]) -> None:
    import common  # benchmarks/engine/common.py: write_result reads RESULTS when it writes

    common.RESULTS = out_dir
    __import__(module).main(argv)


def decode(a) -> None:
    argv = ["--model", a.model, "--device", a.device, "--dtype", a.dtype, "--batch-sizes", a.batch_sizes,
            "--steps", str(a.steps), "--context", str(a.context), "--name", "decode"]
    _bench("bench_decode", a.dir, argv + (["--threads", str(a.threads)] if a.threads else []))


def prefill(a) -> None:
    argv = ["--model", a.model, "--device", a.device, "--dtype", a.dtype, "--tokens", str(a.tokens),
            "--reps", str(a.reps), "--name", "prefill"]
    _bench("bench_prefill", a.dir, argv + (["--threads", str(a.threads)] if a.threads else []))


def batches(a) -> None:
    argv = ["--model", a.model, "--device", a.device, "--dtype", a.dtype, "--grid", a.grid, "--kernels", a.kernels,
            "--steps", str(a.steps), "--name", "batches"]
    _bench("bench_batches", a.dir, argv + (["--threads", str(a.threads)] if a.threads else []))


def throughput(a) -> None:
    argv = ["--model", a.model, "--device", a.device, "--dtype", a.dtype, "--requests", str(a.requests),
            "--kernels", a.kernels, "--name", "throughput"]
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    _bench("bench_throughput", a.dir, argv)


def _attr(e, *names: str) -> float:
    for n in names:
        v = getattr(e, n, None)
        if v is not None:
            return float(v)
    return 0.0


def _profile(eng, device, steps: int, label: str, trace: Path | None = None) -> tuple[str, dict]:
    """Profile `steps` engine steps: two tables (device kernels by time, host by self time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    from common import timed  # benchmarks/engine/common.py

    walls = timed(eng.step, device, steps)  # unprofiled wall time first
    with profile(activities=acts) as prof:
        for _ in range(steps):
            eng.step()
        if cuda:
            torch.cuda.synchronize()
    if trace is not None:  # chrome://tracing or ui.perfetto.dev: the gaps between kernels
        try:
            prof.export_chrome_trace(str(trace))
        except Exception as e:  # the tables matter more than the trace
            print(f"no trace: {e!r}", file=sys.stderr)
    avg = prof.key_averages()
    kernel_us = sum(_attr(e, "self_device_time_total", "self_cuda_time_total") for e in avg
                    if "cuda" in str(getattr(e, "device_type", "")).lower())
    cpu_self_us = sum(_attr(e, "self_cpu_time_total") for e in avg)
    text = [f"## {label}: {steps} steps, wall {1e3 * statistics.median(walls):.3f} ms/step (median, unprofiled)"]
    if cuda:
        text.append(f"device kernel time {kernel_us / 1e3 / steps:.3f} ms/step")
        for key in ("self_device_time_total", "self_cuda_time_total"):
            try:
                table = avg.table(sort_by=key, row_limit=25, max_name_column_width=70)
            except (AttributeError, KeyError, ValueError, TypeError):
                continue
            text += ["", f"### top 25 by device time ({key})", table]
            break
    text += ["", "### top 25 by host (CPU) self time",
             avg.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70)]
    fig = {"steps": steps, "wall_ms_per_step": 1e3 * statistics.median(walls),
           "device_kernel_ms_per_step": kernel_us / 1e3 / steps if cuda else None,
           "host_self_ms_per_step": cpu_self_us / 1e3 / steps}
    return "\n".join(text), fig


def kernels(a) -> None:
    import torch

    from splitserve.engine.engine import EngineConfig, LLMEngine
    from splitserve.engine.sampler import SamplingParams

    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    total = a.context + 4 * a.steps + 16
    eng = LLMEngine(a.model, EngineConfig(device=device, dtype=a.dtype, max_num_seqs=1, max_model_len=total,
                                          num_blocks=-(-total // 16) + 1, cuda_graphs=cuda,
                                          prefix_caching=False))  # each repeat computes the whole prompt
    gen = torch.Generator().manual_seed(0)
    eng.add_request(torch.randint(3, eng.cfg.vocab_size, (a.context,), generator=gen).tolist(),
                    SamplingParams(max_tokens=total - a.context - 1, ignore_eos=True, temperature=0.0))
    for _ in range(4):  # prefill, then a few decodes (captures the graph bucket)
        eng.step()
    sections, figs = [], {"model": a.model, "device": str(device), "dtype": str(eng.dtype), "context": a.context}
    if cuda:
        t, figs["graph"] = _profile(eng, device, a.steps, "B=1 decode step, CUDA graph", a.dir / "trace_graph.json")
        sections.append(t)
    else:
        figs["graph"] = None
        sections.append("## CUDA graph: skipped (not a CUDA device)")
    graphs = getattr(eng, "graphs", None)
    if cuda and graphs is None:
        sections.append("(the engine has no `graphs` attribute: the 'graph' section above may be eager)")
    eng.graphs = None  # eager from here (engine.py: run_batch takes graphs=None as eager)
    for _ in range(2):
        eng.step()
    t, figs["eager"] = _profile(eng, device, a.steps, "B=1 decode step, eager",
                                a.dir / "trace_eager.json" if cuda else None)
    sections.append(t)
    eng.graphs = graphs
    (a.dir / "kernels.txt").write_text("\n\n".join(sections) + "\n")
    (a.dir / "kernels.json").write_text(json.dumps(figs, indent=2) + "\n")
    print(json.dumps(figs))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["decode", "prefill", "kernels", "batches", "throughput"])
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch-sizes", default="1,8,64")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=2048, help="prefill tokens")
    ap.add_argument("--reps", type=int, default=10, help="prefill repetitions")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--grid", default="64x1024,1x512,1x4096", help="batches: BATCHxCONTEXT,...")
    ap.add_argument("--kernels", default="triton,torch", help="batches, throughput: engine/kernels.py choices")
    ap.add_argument("--requests", type=int, default=512, help="throughput: ShareGPT-like requests")
    a = ap.parse_args(argv)
    a.dir.mkdir(parents=True, exist_ok=True)
    {"decode": decode, "prefill": prefill, "kernels": kernels, "batches": batches, "throughput": throughput}[a.part](a)


if __name__ == "__main__":
    main()
