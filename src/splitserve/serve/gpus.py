"""GPUs per worker group: which of this host's GPUs each local worker process gets.

A worker at tensor parallel `tp` is a group of `tp` processes, one per GPU (the engine spawns the
followers; rank r uses device index base + r of those its process sees). Locally, with
`--device cuda` (or `auto` on a host with GPUs), each worker gets `tp` consecutive GPUs of those
present, in worker-id order (prompt pool, token pool, mixed pool), as its process's
CUDA_VISIBLE_DEVICES: its ranks then run on cuda:0..tp-1. Fewer GPUs than the groups need is one
error line naming both numbers. Two cases keep the behaviour from before worker groups:

- every pool at tp 1 and fewer GPUs than workers: the workers share the GPUs round-robin (1 prompt
  + 1 token worker on one GPU, as serve always ran them there);
- `--transport local` (tp 1 only: config.validate): every worker keeps this process's GPUs
  visible and gets `--device cuda:<its GPU>` instead, because a CUDA IPC handle names its owner's
  GPU by index and both ends must count the GPUs alike (shm.py).

`--device cpu` and echo workers get no GPU. On Ray, a CUDA worker's actor asks for `tp` GPUs
(launcher.actor_resources): one actor's resources come from one node, so the group is packed on
one node, as a placement group of one `tp`-GPU bundle (STRICT_PACK) would pack it, and Ray sets the
actor's CUDA_VISIBLE_DEVICES to those GPUs (its followers inherit it).
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Sequence

from ..errors import UserError

POOLS = ("prompt", "token", "mixed")


def describe(groups: Sequence[tuple[str, int, int]]) -> str:
    """'2 prompt workers x tp 2 + 1 token worker x tp 4' of (pool, workers, tp) triples."""
    return " + ".join(f"{n} {pool} worker{'s' * (n != 1)} x tp {tp}" for pool, n, tp in groups if n)


def groups_of(homes: Sequence[str], tps: Sequence[int]) -> list[tuple[str, int, int]]:
    """(pool, workers, tp) of each pool, from each worker's home and tp (by worker id)."""
    out: dict[tuple[str, int], int] = {}
    for home, tp in zip(homes, tps):
        out[home, tp] = out.get((home, tp), 0) + 1
    return [(home, n, tp) for (home, tp), n in sorted(out.items(), key=lambda kv: POOLS.index(kv[0][0]))]


def needed(tps: Sequence[int]) -> int:
    """GPUs the workers need, each group its own."""
    return sum(tps)


def assign(homes: Sequence[str], tps: Sequence[int], present: int, share: bool = True) -> list[tuple[int, ...]]:
    """Each worker's GPUs (indices 0..present-1 of those present), by worker id: `tp` consecutive
    ones per worker; round-robin single GPUs where every tp is 1, there are fewer GPUs than
    workers and `share` (not with --transport nccl: NCCL cannot join two ranks on one GPU); else
    UserError naming how many are needed and how many there are."""
    need = needed(tps)
    if need <= present:
        out, at = [], 0
        for tp in tps:
            out.append(tuple(range(at, at + tp)))
            at += tp
        return out
    if present > 0 and all(tp == 1 for tp in tps):
        if share:
            return [(i % present,) for i in range(len(tps))]
    raise UserError(f"{describe(groups_of(homes, tps))} need {need} GPUs; this host has {present}"
                    + ("" if present else " (use --device cpu)")
                    + ("" if share else " (--transport nccl: NCCL cannot join two workers on one GPU)")
                    + ": give fewer workers or a smaller --tp/--prompt-tp/--token-tp")


def cpu_only_torch() -> bool:
    """Whether the installed torch is a CPU build (`+cpu` in its version), which has no CUDA
    whatever the host: read from its metadata, as importing torch to ask costs ~1 s at every
    serve start."""
    try:
        return importlib.metadata.version("torch").endswith("+cpu")
    except importlib.metadata.PackageNotFoundError:
        return False            # torch's own import says what is missing


def gpus_present() -> list[str]:
    """This host's GPUs as a worker's CUDA_VISIBLE_DEVICES names them: this process's
    CUDA_VISIBLE_DEVICES entries where it is set, else 0..n-1 (torch counts them; imported here,
    not at a CLI module's top)."""
    if cpu_only_torch():
        return []
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        ids = [x.strip() for x in cvd.split(",") if x.strip()]
        return ids[:n]
    return [str(i) for i in range(n)]


def cpu_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:      # not Linux
        return os.cpu_count() or 1


def worker_devices(homes: Sequence[str], tps: Sequence[int], gpu_ids: Sequence[str], wid: int,
                   same_devices: bool) -> tuple[str | None, str | None]:
    """(--device, CUDA_VISIBLE_DEVICES) of worker `wid` on this host's GPUs `gpu_ids` (None: leave
    as it is). `same_devices` (--transport local): every worker sees them all and gets
    cuda:<index> of its GPU instead."""
    if not gpu_ids:
        return None, None
    mine = assign(homes, tps, len(gpu_ids))[wid]
    if same_devices:
        return f"cuda:{mine[0]}", None
    return "cuda", ",".join(gpu_ids[i] for i in mine)
