"""What CURVE encryption (`splitserve serve --kv-encryption on`) costs a KV transfer: the tcp
transport alone, with and without it.

    python benchmarks/serve/kv_curve.py            # about a minute; writes kv_curve.json here

Two processes stand for a prompt worker and a token worker: each holds a TcpTransport
(serve/kv/transports.py) and a Codec under one cluster secret, as the workers do, and for the
encrypted pair the cluster's CURVE keys (serve/curve.py). The sender sends a signed message
with one data frame of S bytes (K/V bytes as a transfer carries them); the receiver takes it
through recv_all (the codec verifies the MAC and the data digest) and answers with a small signed
ack; the sender times the round trip. So a figure covers signing, ZeroMQ over loopback TCP and
verifying, and for the encrypted pair CURVE's encryption and decryption on top (libzmq does it in
each process's I/O thread). Both pairs run side by side and their round trips alternate, so
drift on a shared machine hits both alike.

Sizes (default): 64 KiB; 1 MiB; 6.144 MB, one layer of llama3-8b's K/V for a 1,500-token prompt
in bfloat16 (2 x 8 kv heads x 128 x 1,500 x 2 B), what a layer-wise transfer sends per message;
24.576 MB, the whole K/V of the 2-layer float32 shape kv_transfer.py serves on CPU (a serialized
transfer). Reported per size: P50 and min round trip of each pair, MB/s = S / P50 round trip, and
the ratio encrypted / plain of the P50s.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

from live import header  # this folder

SECRET = bytes(range(32))
SIZES = (64 << 10, 1 << 20, 2 * 8 * 128 * 1500 * 2, 2 * 2 * 8 * 128 * 1500 * 4)


def _receiver(encrypted: bool, conn) -> None:
    import zmq

    from splitserve.serve.curve import CurveKeys
    from splitserve.serve.kv.transports import Target, TcpTransport
    from splitserve.serve.protocol import Codec

    ctx = zmq.Context()
    t = TcpTransport(ctx, Codec(SECRET, "token"), curve=CurveKeys.from_secret(SECRET) if encrypted else None)
    conn.send(t.address)
    back = Target(peer=0, ident="prompt", address=conn.recv())
    while True:
        t.inbound.poll(1000)
        for h, data in t.recv_all():
            if h["t"] == "stop":
                t.close()
                ctx.destroy(linger=0)
                return
            t.send(back, {"t": "ack", "n": h["n"], "bytes": sum(len(d) for d in data)})


class Pair:
    """The sending side of one (prompt, token) pair; the token side runs in its own process."""

    def __init__(self, encrypted: bool) -> None:
        import zmq

        from splitserve.serve.curve import CurveKeys
        from splitserve.serve.kv.transports import Target, TcpTransport
        from splitserve.serve.protocol import Codec

        self.ctx = zmq.Context()
        self.t = TcpTransport(self.ctx, Codec(SECRET, "prompt"),
                              curve=CurveKeys.from_secret(SECRET) if encrypted else None)
        here, there = mp.Pipe()
        self.proc = mp.get_context("spawn").Process(target=_receiver, args=(encrypted, there), daemon=True)
        self.proc.start()
        self.to = Target(peer=1, ident="token", address=here.recv())
        here.send(self.t.address)
        self.n = 0

    def round_trip(self, data) -> float:
        self.n += 1
        t0 = time.perf_counter()
        if not self.t.send(self.to, {"t": "kvl", "n": self.n}, data):
            raise RuntimeError("the send queue refused a message")
        while True:
            if not self.t.inbound.poll(30_000):
                raise RuntimeError("no ack within 30 s")
            for h, _ in self.t.recv_all():
                if h["n"] == self.n:
                    if h["bytes"] != len(data):
                        raise RuntimeError(f"the receiver got {h['bytes']} bytes of {len(data)}")
                    return time.perf_counter() - t0

    def close(self) -> None:
        self.t.send(self.to, {"t": "stop", "n": 0})
        self.proc.join(10)
        self.t.close()
        self.ctx.destroy(linger=0)


def main() -> int:
    import numpy as np
    import zmq

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma-separated message sizes in "
                    "bytes (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=30, help="measured round trips per size and pair "
                    "(default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=3, help="round trips first, not measured (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("kv_curve.json"),
                    help="results JSON (default: %(default)s)")
    args = ap.parse_args()
    if not zmq.has("curve"):
        print(f"error: this libzmq ({zmq.zmq_version()}) has no CURVE", file=sys.stderr)
        return 1
    sizes = [int(s) for s in args.sizes.split(",") if s]
    results: dict = {**header("kv_curve"), "libzmq": zmq.zmq_version(), "pyzmq": zmq.__version__,
                     "repeats": args.repeats, "warmup": args.warmup, "runs": []}
    t0 = time.perf_counter()
    pairs = {"plain": Pair(False), "curve": Pair(True)}
    try:
        rng = np.random.default_rng(0)
        print(f"{'bytes':>10s} {'plain P50 ms':>12s} {'curve P50 ms':>12s} {'plain MB/s':>10s} {'curve MB/s':>10s} "
              f"{'curve/plain':>11s}")
        for size in sizes:
            data = rng.integers(0, 256, size, dtype=np.uint8)
            rt: dict[str, list[float]] = {k: [] for k in pairs}
            for i in range(args.warmup + args.repeats):
                for k, p in pairs.items():
                    s = p.round_trip(data)
                    if i >= args.warmup:
                        rt[k].append(s)
            run = {"bytes": size}
            for k, xs in rt.items():
                p50 = statistics.median(xs)
                run[k] = {"p50_ms": p50 * 1e3, "min_ms": min(xs) * 1e3, "max_ms": max(xs) * 1e3,
                          "mb_per_s_p50": size / p50 / 1e6, "round_trips_ms": [x * 1e3 for x in xs]}
            run["ratio_p50"] = run["curve"]["p50_ms"] / run["plain"]["p50_ms"]
            results["runs"].append(run)
            print(f"{size:>10d} {run['plain']['p50_ms']:>12.3f} {run['curve']['p50_ms']:>12.3f} "
                  f"{run['plain']['mb_per_s_p50']:>10.0f} {run['curve']['mb_per_s_p50']:>10.0f} "
                  f"{run['ratio_p50']:>11.2f}", flush=True)
    finally:
        for p in pairs.values():
            p.close()
    results["wall_s"] = time.perf_counter() - t0
    import json
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out} ({results['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
