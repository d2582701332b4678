"""`splitserve profile`: measure splitserve's own engine on this machine, for the simulator.

It runs the Splitwise authors' protocol on our engine: one row per (prompt_size, batch_size,
token_size) is `batch_size` requests of `prompt_size` random token ids, each generating
`token_size` tokens; `prompt_time` is the one prompt step (the prompt-token cap is raised so the
whole batch is one step), `token_time` the mean of the decode steps after it, `e2e_time` all of
it (ms, as in their CSV). Two sweeps, as in their profile:

- batch 1 over prompt sizes (the prompt curve, and how decode time grows with context);
- the batch sizes at one short prompt (how decode time grows with the batch).

Each row is measured `--repeats` times, after a warm-up (on a GPU, one of each row's shape). The
engine is a worker's (`build_engine`: preset, dtype, device, KV blocks), with `--threads` torch
threads: "one worker of `splitserve serve` here". Also measured: the KV capacity (blocks x block
size) and the KV link of each transport (transfer.py).

Output, in --out: `profile.csv` (the Splitwise columns; `hardware` is the machine's name, power
columns 0) and `machine.json` (machine.py reads both). Rows are appended as they are measured;
a rerun with the same settings skips what is there (resume after an interruption).
"""

from __future__ import annotations

import csv
import json
import os
import platform
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from .corun import measure_corun

COLUMNS = ("model", "hardware", "prompt_size", "batch_size", "token_size", "peak_power", "average_power",
           "prompt_time", "token_time", "e2e_time", "tensor_parallel")
PROMPT_SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048)
# every batch size up to 8: this engine's CPU kernels are not monotone in the batch (a decode of
# 3 requests ran slower than one of 4), so interpolating between powers of two misses by 20-40%
BATCH_SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
SWEEP_PROMPT = 32     # prompt size of the batch sweep
# decode over batch x context: batches of long prompts, whose decodes read 512 tokens of KV each
CONTEXT_PROMPT = 512
CONTEXT_BATCHES = (2, 4, 8, 16)
TOKENS = 16           # tokens each request generates (the decode steps averaged)
MIXED = ((4, 256, 512), (8, 256, 512), (16, 128, 512), (8, 256, 256))  # (decodes, their context, prompt)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileSettings:
    model: str = "small"
    device: str = "cpu"
    dtype: str = "auto"
    threads: int = 1
    num_blocks: int | None = None
    repeats: int = 3
    prompt_sizes: tuple[int, ...] = PROMPT_SIZES
    batch_sizes: tuple[int, ...] = BATCH_SIZES
    sweep_prompt: int = SWEEP_PROMPT
    context_prompt: int = CONTEXT_PROMPT
    context_batches: tuple[int, ...] = CONTEXT_BATCHES
    tokens: int = TOKENS
    seed: int = 0
    hardware: str = ""  # the machine's name in profile.csv; default: derived from this machine
    corun_rounds: int = 9   # measure_corun's rounds alone and shared
    mixed_repeats: int = 3  # measure_mixed's repeats of each shape

    def grid(self) -> list[tuple[int, int, int]]:
        """(prompt_size, batch_size, token_size) of every row, each once."""
        rows = [(p, 1, self.tokens) for p in self.prompt_sizes]
        rows += [(self.sweep_prompt, b, self.tokens) for b in self.batch_sizes
                 if (self.sweep_prompt, b, self.tokens) not in rows]
        rows += [(self.context_prompt, b, self.tokens) for b in self.context_batches
                 if (self.context_prompt, b, self.tokens) not in rows]
        return rows


def machine_name(device: str) -> str:
    """A short name for this machine: `cpu<cores>-<processor>` or `cuda-<gpu>`."""
    if device.startswith("cuda"):
        import torch
        return "cuda-" + torch.cuda.get_device_name(0).replace(" ", "-").lower()
    return f"cpu{os.cpu_count()}-" + "-".join(cpu_model().lower().split()[:3])


def cpu_model() -> str:
    """This machine's CPU model (Linux: /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def engine_limits(grid: list[tuple[int, int, int]]) -> tuple[int, int]:
    """(prompt-token cap, running sequences) of the profiling engine: each row's batch in one
    prompt step, and each of measure_mixed's steps (a prompt joining b decodes), whatever the grid."""
    return (max(max(p * b for p, b, _ in grid), max(p + b for b, _, p in MIXED)),
            max(max(b for _, b, _ in grid), max(b for b, _, _ in MIXED) + 1))


def profiling_engine(s: ProfileSettings, prompt_cap: int, max_seqs: int):
    """The engine a worker builds (worker_engine.build_engine) from a worker's own options and their
    defaults (not profiled yet: --cuda-graphs, --kernels triton), with the profile's batch limits."""
    from ..policy.config import PolicyConfig
    from ..policy.machine import BatchingConfig
    from ..serve.worker_args import parse_args
    from ..serve.worker_engine import build_engine

    argv = ["--id", "0", "--router", "-", "--model", s.model, "--device", s.device, "--dtype", s.dtype,
            "--seed", str(s.seed), "--max-num-seqs", str(max(256, max_seqs)), "--threads", str(s.threads),
            "--no-prefix-caching"]  # every row computes its prompts whole, repeats alike
    if s.num_blocks is not None:
        argv += ["--num-blocks", str(s.num_blocks)]
    args = parse_args(argv)
    args.policy = PolicyConfig(batching=BatchingConfig(prompt_token_cap=prompt_cap, max_seqs=max_seqs))
    return build_engine(args)


def measure_row(engine, p: int, b: int, t: int, rng: random.Random) -> dict:
    """One row: b requests of p prompt tokens generating t tokens each; times in ms."""
    from ..engine.sampler import SamplingParams

    vocab = engine.cfg.vocab_size
    params = SamplingParams(max_tokens=t, temperature=0.0, ignore_eos=True)
    for _ in range(b):
        engine.add_request([rng.randrange(3, vocab) for _ in range(p)], params)
    steps = []
    start = time.perf_counter()
    while engine.has_unfinished():
        t0 = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t0)
    e2e = time.perf_counter() - start
    if len(steps) != t:
        raise UserError(f"row {p}x{b}x{t} took {len(steps)} steps, not {t}: the batch did not fit in one "
                        "prompt step (give the engine more KV blocks with --num-blocks)")
    return {"prompt_size": p, "batch_size": b, "token_size": t, "peak_power": 0.0, "average_power": 0.0,
            "prompt_time": steps[0] * 1e3, "token_time": statistics.fmean(steps[1:]) * 1e3 if t > 1 else 0.0,
            "e2e_time": e2e * 1e3, "tensor_parallel": 1}


def done_rows(path: Path, model: str, hardware: str) -> Counter:
    """How many repeats of each (p, b, t) profile.csv already holds for this model and machine."""
    n: Counter = Counter()
    if path.exists():
        with path.open(newline="") as f:
            for r in csv.DictReader(f):
                if r["model"] == model and r["hardware"] == hardware:
                    n[(int(r["prompt_size"]), int(r["batch_size"]), int(r["token_size"]))] += 1
    return n


def run_profile(s: ProfileSettings, out: Path, progress=None) -> dict:
    """Measure every row not yet in out/profile.csv, the KV capacity and the KV links; write
    out/machine.json; return it. `progress(done, total, label)` is called after each row."""
    import torch

    torch.set_num_threads(s.threads)
    hardware = s.hardware or machine_name(s.device)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "profile.csv"
    grid = s.grid()
    engine = profiling_engine(s, *engine_limits(grid))
    rng = random.Random(s.seed)
    measure_row(engine, 64, 1, 4, rng)  # warm-up
    _measure_rows(engine, s, hardware, csv_path, rng, progress)
    facts = _machine_facts(engine, s, hardware, rng)
    del engine  # the probe's worker gets the memory and the core
    path = _measure_path(s, hardware, csv_path, facts, out)
    if path is not None:
        facts["path"] = path
    (out / "machine.json").write_text(json.dumps(facts, indent=1) + "\n")
    return facts


def _measure_rows(engine, s: ProfileSettings, hardware: str, csv_path: Path, rng: random.Random,
                  progress=None) -> None:
    """Each repeat of each row of the grid that `csv_path` lacks, appended to it as it is measured."""
    have = done_rows(csv_path, s.model, hardware)
    todo = [(row, k) for row in s.grid() for k in range(have[row], s.repeats)]
    if progress is not None and not todo:
        progress(0, 0, "every row is there already")
    new = not csv_path.exists()
    with csv_path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            w.writeheader()
        for i, ((p, b, t), k) in enumerate(todo):
            if s.device.startswith("cuda") and k == have[(p, b, t)]:  # a GPU's first step of a shape
                measure_row(engine, p, b, t, rng)  # can take 100x a later one (H200: 425 ms at 128 tokens, 5 at 64)
            w.writerow({"model": s.model, "hardware": hardware, **measure_row(engine, p, b, t, rng)})
            f.flush()
            if progress is not None:
                progress(i + 1, len(todo), f"{p} tokens x {b}")


def _machine_facts(engine, s: ProfileSettings, hardware: str, rng: random.Random) -> dict:
    """machine.json but its serving path: the engine's KV capacity and layout, the KV links, the
    mixed steps, the co-run slowdown, and how and where it was measured."""
    import torch

    from .transfer import measure_links

    layout = engine.kv_host.kv_layout
    return {
        "name": hardware,
        "model": s.model,
        "device": s.device,
        "dtype": str(engine.dtype).removeprefix("torch."),
        "kv_capacity_tokens": engine.blocks.num_blocks * engine.blocks.block_size,
        "block_size": engine.blocks.block_size,
        "num_blocks": engine.blocks.num_blocks,
        "kv_bytes_per_token": layout.bytes_per_token,
        "max_model_len": engine.max_model_len,
        "model_config": engine.cfg.to_dict() if hasattr(engine.cfg, "to_dict") else _config_dict(engine.cfg),
        "links": measure_links(layout.bytes_per_token, engine.cfg.num_layers),
        "mixed": measure_mixed(engine, rng, s.mixed_repeats),
        "corun": measure_corun(engine, s.model, s.device, s.threads, rng, s.corun_rounds),
        "host_cores": os.cpu_count(),
        "how": {"threads_per_worker": s.threads, "pinning": "none (the OS schedules)",
                "concurrent": "one engine alone in this process; the machine otherwise idle",
                "repeats": s.repeats, "tokens_per_row": s.tokens, "seed": s.seed},
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "measured": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def _measure_path(s: ProfileSettings, hardware: str, csv_path: Path, facts: dict, out: Path) -> dict | None:
    """The serving path's overheads (path.py), timed against the profile's own row of its probe's
    prompt; None where the grid has no such row."""
    from ..perf.profile_fit import read_profile_rows
    from .path import PROMPT as PATH_PROMPT
    from .path import measure_path

    shape = [r for r in read_profile_rows(csv_path, s.model, hardware, 1)
             if (r["prompt_size"], r["batch_size"]) == (PATH_PROMPT, 1)]
    if not shape:
        return None
    return measure_path(facts, statistics.median(r["prompt_time"] for r in shape),
                        statistics.median(r["token_time"] for r in shape), out / "path")


def measure_mixed(engine, rng: random.Random, repeats: int = 3) -> list[dict]:
    """Steps that run a prompt and decodes together: `b` requests of `ctx` prompt tokens decoding
    (after their prefill and two decode steps), then a prompt of `p` tokens joins; the step that
    runs them all, in ms (median of repeats), and its decodes' KV tokens. An engine whose batch
    limits would run the prompt in a step of its own is refused (a decode step timed as a mixed
    one, as the CI grid's 8-request limit once did for three of the four shapes)."""
    from ..engine.sampler import SamplingParams

    vocab = engine.cfg.vocab_size
    out = []
    for b, ctx, p in MIXED:
        times = []
        for _ in range(repeats):
            for _ in range(b):
                engine.add_request([rng.randrange(3, vocab) for _ in range(ctx)],
                                   SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
            decoding = 0
            while decoding < 2:  # their prefill (in as many steps as the prompt cap takes), two decode steps
                engine.step()
                decoding += bool(engine.last_shape) and all(n == 1 for _, n in engine.last_shape)
            engine.add_request([rng.randrange(3, vocab) for _ in range(p)],
                               SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
            t0 = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t0)
            ran = sorted(n for _, n in engine.last_shape)
            if ran != [1] * b + [p]:
                raise RuntimeError(f"the mixed step of {b} decodes and a {p}-token prompt ran as {len(ran)} "
                                   f"sequences of {sum(ran)} tokens: the engine's batch limits must admit it")
            context = sum(kv for kv, n in engine.last_shape if n == 1)
            while engine.has_unfinished():
                engine.step()
        out.append({"decodes": b, "context": context, "prompt": p, "ms": statistics.median(times) * 1e3})
    return out


def _config_dict(cfg) -> dict:
    from dataclasses import asdict, is_dataclass

    d = asdict(cfg) if is_dataclass(cfg) and not isinstance(cfg, type) else dict(vars(cfg))
    return {k: v for k, v in d.items() if isinstance(v, (int, float, str, bool, type(None), list, tuple))}
