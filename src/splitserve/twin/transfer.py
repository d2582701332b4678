"""The KV link between two workers on this machine, as the simulator models it: a fixed cost per
transfer plus bytes / bandwidth (sim/kv_transfer.py). Measured on what each transport moves:

- tcp: a signed ZeroMQ message with the KV in one data frame, over loopback tcp, from one socket
  to another in this process (what serve/kv/transports.TcpTransport sends), timed to its receipt;
  the sender's part (signing and handing the frame to ZeroMQ) is also timed on its own;
- local: one torch copy into a tensor of the receiver's KV layout (what LocalTransport does into
  a shared region, without the region); the sender does all of it.

Sizes are those of 16 to 4,096 tokens of the model's KV; each is sent several times and the
median kept; the line through the medians (least squares of the relative error) gives fixed cost
and bandwidth, for the whole transfer and (`sender`) for the sender's part. A serving worker sends
inside its engine step, so the simulator puts the sender's part in the prompt worker's step
(twin/machine.py) and the rest (ZeroMQ's I/O thread, the receiver's check and copy) in the host's
background load.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

SIZES_TOKENS = (16, 256, 1024, 4096)
REPEATS = 5


def _fit(points: list[tuple[int, float]]) -> dict:
    """seconds = fixed + bytes / bandwidth through (bytes, seconds), least squares of the relative
    error: the sizes span 256x, and an absolute fit would be the largest size's alone."""
    xs, ys = np.array([x for x, _ in points], float), np.array([y for _, y in points], float)
    slope, fixed = np.polyfit(xs, ys, 1, w=1.0 / ys)  # residuals / y: the relative error
    if fixed < 0:  # no negative cost: the line through the origin
        fixed, slope = 0.0, float(np.sum(xs / ys) / np.sum((xs / ys) ** 2))
    slope, fixed = float(slope), float(fixed)
    return {"fixed_s": fixed, "bandwidth_bytes_per_s": 1.0 / slope if slope > 0 else float("inf"),
            "points": [{"bytes": int(x), "seconds": y} for x, y in points]}


def _tcp(sizes: list[int]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(whole transfer, sender's part) medians per size."""
    import zmq

    from ..serve.protocol import Codec

    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    try:
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        push.connect(f"tcp://127.0.0.1:{port}")
        tx, rx = Codec(b"k" * 32, "a"), Codec(b"k" * 32, "b")
        whole, sender = [], []
        for n in sizes:
            data = bytes(n)
            times, sends = [], []
            for _ in range(REPEATS + 1):
                t0 = time.perf_counter()
                push.send_multipart(tx.encode({"t": "kvd"}, data, to="b"), copy=False)
                t1 = time.perf_counter()
                rx.decode(pull.recv_multipart(copy=False), sender="a")
                times.append(time.perf_counter() - t0)
                sends.append(t1 - t0)
            whole.append((n, statistics.median(times[1:])))
            sender.append((n, statistics.median(sends[1:])))
        return whole, sender
    finally:
        push.close(linger=0)
        pull.close(linger=0)
        ctx.term()


def _local(sizes: list[int]) -> list[tuple[int, float]]:
    import torch

    out = []
    for n in sizes:
        src, dst = torch.ones(n // 4, dtype=torch.float32), torch.zeros(n // 4, dtype=torch.float32)
        times = []
        for _ in range(REPEATS + 1):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
        out.append((n, statistics.median(times[1:])))
    return out


def measure_links(kv_bytes_per_token: int, layers: int) -> dict:
    """{"tcp": fit, "local": fit} for whole transfers of this model's KV, each with the sender's
    part as "sender" (layers: recorded, the simulator splits a layer-wise transfer into `layers`
    equal parts)."""
    sizes = [t * kv_bytes_per_token for t in SIZES_TOKENS]
    whole, sender = _tcp(sizes)
    local = _fit(_local(sizes))
    return {"layers": layers, "tcp": {**_fit(whole), "sender": _fit(sender)},
            "local": {**local, "sender": {k: v for k, v in local.items() if k != "points"}}}
