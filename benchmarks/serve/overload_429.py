"""The latency of shed requests (429) under overload, with an open-loop load generator.

    python benchmarks/serve/overload_429.py [--rate 600] [--duration 20] [--runs 3] [--stream]
        [--max-tokens 128] [--probe-rate 20] [--connections 1024] [--serve-args "..."] [--out overload_429.json]
    python benchmarks/serve/overload_429.py --table overload_429*.json      # the README's rows

Starts `splitserve serve --model tiny --prompt-workers 1 --token-workers 1` (plus `--serve-args`),
then offers `--rate` short chat completions a second for `--duration` seconds, Poisson arrivals
from a seeded generator, whatever the server answers: an open loop, as users arrive, not as
answers come back. Each request is sent at its scheduled time on an idle keep-alive connection
(a new one is opened when none is idle, up to `--connections`; past that the request counts as
`not_sent`; a kept-alive connection that the server closes as the request is written, its
keep-alive timeout crossing it, is retried once on a new one, as HTTP clients do, and counted in
`retried_closed_keepalive`). Its latency runs from the scheduled time to the last byte of the
answer, so a client that falls behind shows as latency, not as a lower rate (no coordinated
omission); the part from the request's bytes written to the answer (`service_429`) leaves out
the client's own lateness and connecting (`send_lag`).

The client is this process: asyncio protocols on uvloop that write a prepared request and read
the status line, headers and Content-Length body (or a stream's chunks to the last), nothing
more, so that it costs tens of microseconds a request (httpx costs about a millisecond here and
cannot offer 600 req/s on the 2-core VM). The server and its workers are other processes. Of
`--rate`, `--probe-rate` requests a second come from a second client process that does nothing
else (`probe` in the results): its latencies leave out this process's own busy loop (reading
the streams of the 200s), which the flood's include.

Reported per run: offered and achieved rates, the count of each status, requests lost (status 0:
the connection closed before a byte of the answer, -1: during it, -2: no answer within
`--timeout`, -3: no connection), and the latency P50/P90/P99/max of the 200s
and of the 429s; also the server's own `splitserve_rejected_total{status="429"}` against the
client's count, and the CPU of the server, its workers, this client and the rest of the machine
(`other_pct`: other people's work on a shared host), each in percent of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import shlex
import sys
import time
from pathlib import Path

from live import TICK, children, free_port, header, machine_busy, scrape, serve_cmd, start, stop  # this folder

HERE = Path(__file__).resolve().parent
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def body(max_tokens: int, stream: bool) -> dict:
    return {**BODY, "max_tokens": max_tokens, **({"stream": True} if stream else {})}


def request_bytes(port: int, body: dict) -> bytes:
    raw = json.dumps(body, separators=(",", ":")).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n")
    return head.encode() + raw


class Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: one request at a time; the answer's status, when done."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.head: bytes | None = None
        self.length = -1
        self.waiter: asyncio.Future | None = None
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def send(self, data: bytes) -> asyncio.Future:
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(data)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.head is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.head = bytes(self.buf[:end]).lower()
            del self.buf[:end + 4]
            i = self.head.find(b"content-length:")
            self.length = int(self.head[i + 15:].split(b"\r\n", 1)[0]) if i >= 0 else -1
        if self.length >= 0 and len(self.buf) < self.length:
            return
        if self.length < 0 and not self.buf.endswith(b"0\r\n\r\n"):  # chunked (a stream): its last chunk
            return
        head, self.head = self.head, None
        self.buf.clear()
        self._finish(int(head[9:12]), b"connection: close" in head)

    def _finish(self, status: int, close: bool) -> None:
        if close:
            self.close()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(status)

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            # 0: closed before a byte of the answer (on a kept-alive connection: the server's
            # keep-alive timeout crossing the request, which a client retries); -1: during it
            self.waiter.set_result(0 if self.head is None and not self.buf else -1)


async def offer(port: int, rate: float, duration: float, max_conns: int, timeout: float, seed: int,
                body: dict) -> dict:
    """The open loop: Poisson arrivals at `rate` for `duration` s; every request's (status, latency).
    Times by perf_counter (uvloop's own clock counts whole milliseconds)."""
    loop = asyncio.get_running_loop()
    now = time.perf_counter
    data = request_bytes(port, body)
    idle: list[Conn] = []
    opened = [0]
    results: list[tuple[int, float, float, bool]] = []  # (status, latency from schedule, send lag, new connection)
    not_sent, retried = [0], [0]

    async def connection() -> tuple[Conn | None, bool]:
        """An idle connection, else a new one (None: none allowed, or it failed); whether new."""
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn, False
            opened[0] -= 1          # the server closed it while idle (keep-alive timeout)
        if opened[0] >= max_conns:
            return None, True
        opened[0] += 1
        try:
            return (await loop.create_connection(Conn, "127.0.0.1", port))[1], True
        except OSError:
            opened[0] -= 1
            return None, True

    async def one(t_sched: float) -> None:
        lag = 0.0
        for attempt in range(2):    # a kept-alive connection closed under the request: once more, anew
            conn, new = await connection()
            if conn is None:
                if opened[0] >= max_conns:
                    not_sent[0] += 1
                else:
                    results.append((-3, now() - t_sched, now() - t_sched, True))   # -3: could not connect
                return
            lag = now() - t_sched if attempt == 0 else lag
            try:
                status = await asyncio.wait_for(conn.send(data), timeout)
            except asyncio.TimeoutError:
                status = -2         # no answer within the timeout
                conn.close()
            if conn.closed:
                opened[0] -= 1
            else:
                idle.append(conn)
            if status != 0 or new:
                break
            retried[0] += 1
        results.append((status, now() - t_sched, lag, new))

    rng = random.Random(seed)
    tasks = []
    t0 = now()
    t = t0
    while t < t0 + duration:
        t += rng.expovariate(rate)
        delay = t - now()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(t)))
    sent_s = now() - t0
    await asyncio.gather(*tasks)
    return {"scheduled": len(tasks), "offer_s": sent_s, "wall_s": now() - t0, "not_sent": not_sent[0],
            "retried_closed_keepalive": retried[0],
            "connections_opened_max": max_conns if not_sent[0] else None, "results": results}


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def latencies(xs: list[float]) -> dict:
    return {"n": len(xs), **{k: (None if pct(xs, q) is None else round(1e3 * pct(xs, q), 3))  # type: ignore[operator]
                             for k, q in (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99), ("max_ms", 1.0))}}


def summarize(raw: dict, rate: float, duration: float) -> dict:
    res = raw.pop("results")
    counts: dict[str, int] = {}
    for s, *_ in res:
        counts[str(s)] = counts.get(str(s), 0) + 1
    ok = [lat for s, lat, *_ in res if s == 200]
    shed = [lat for s, lat, *_ in res if s == 429]
    return {**raw, "rate_target": rate, "duration_s": duration,
            "offered_rps": round(raw["scheduled"] / raw["offer_s"], 1),
            "sent_rps": round(len(res) / raw["offer_s"], 1),
            "served_rps": round(len(ok) / raw["wall_s"], 1),
            "status_counts": counts,   # 0, -1, -2, -3: lost (closed before or during the answer, timed out,
                                       # no connection)
            "lost": sum(v for k, v in counts.items() if int(k) <= 0) + raw["not_sent"],
            "server_errors_5xx": sum(v for k, v in counts.items() if k.startswith("5")),
            "latency_200": latencies(ok), "latency_429": latencies(shed),
            # from the request's bytes written to its answer: what the server (and the kernel) took
            "service_429": latencies([lat - lag for s, lat, lag, _ in res if s == 429]),
            "service_429_kept_alive": latencies([lat - lag for s, lat, lag, new in res if s == 429 and not new]),
            # from the scheduled time to the bytes written: the client's lateness, and connecting
            "send_lag": latencies([lag for _, _, lag, _ in res]),
            "new_connections": sum(1 for *_, new in res if new)}


def cpu_ticks(pid: int) -> int:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return int(f[11]) + int(f[12])
    except (OSError, IndexError, ValueError):
        return 0


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def _probe(port: int, rate: float, duration: float, timeout: float, seed: int, body: dict, conn) -> None:
    """The probe process: its own open loop at a low rate, beside the flood (see the docstring)."""
    loop = new_loop()
    raw = loop.run_until_complete(offer(port, rate, duration, 64, timeout, seed, body))
    conn.send(summarize(raw, rate, duration))
    conn.close()


def one_run(args, seed: int) -> dict:
    port = free_port()
    cmd = serve_cmd("--model", "tiny", "--prompt-workers", "1", "--token-workers", "1", "--port", str(port),
                    *shlex.split(args.serve_args))
    proc = start(cmd, port, timeout=120, log=Path(args.log) if args.log else None)
    try:
        workers = children(proc.pid)
        loop = new_loop()
        loop.run_until_complete(offer(port, 5, 2, 16, args.timeout, seed + 1000, BODY))  # warm up
        before = scrape(f"http://127.0.0.1:{port}")
        cpu0 = (cpu_ticks(proc.pid), sum(cpu_ticks(w) for w in workers), time.process_time(), machine_busy() or 0)
        ctx = multiprocessing.get_context("spawn")
        recv, send = ctx.Pipe(duplex=False)
        probe = ctx.Process(target=_probe, args=(port, args.probe_rate, args.duration, args.timeout, seed + 2000,
                                                 body(args.max_tokens, args.stream), send))
        probe.start()
        t0 = time.perf_counter()
        raw = loop.run_until_complete(offer(port, args.rate - args.probe_rate, args.duration, args.connections,
                                            args.timeout, seed, body(args.max_tokens, args.stream)))
        wall = time.perf_counter() - t0
        probed = recv.recv()
        probe.join()
        cpu = {"server_pct": 100 * (cpu_ticks(proc.pid) - cpu0[0]) / TICK / wall,
               "workers_pct": 100 * (sum(cpu_ticks(w) for w in workers) - cpu0[1]) / TICK / wall,
               "client_pct": 100 * (time.process_time() - cpu0[2]) / wall,
               "machine_pct": 100 * ((machine_busy() or 0) - cpu0[3]) / TICK / wall}
        cpu["other_pct"] = max(0.0, cpu["machine_pct"] - cpu["server_pct"] - cpu["workers_pct"] - cpu["client_pct"])
        after = scrape(f"http://127.0.0.1:{port}")
        loop.close()
    finally:
        stop(proc)
    out = summarize(raw, args.rate - args.probe_rate, args.duration)
    out["probe"] = probed
    key = 'splitserve_rejected_total{status="429"}'
    out["server_rejected_429"] = after.get(key, 0) - before.get(key, 0)
    out["cpu"] = {k: round(v, 1) for k, v in cpu.items()}
    out["serve_command"] = " ".join(shlex.quote(c) for c in cmd[1:])
    return out


def line(r: dict) -> str:
    a, b, c, p = r["latency_429"], r["latency_200"], r["service_429"], r["probe"]["latency_429"]
    return (f"offered {r['offered_rps']} req/s, served {r['served_rps']} req/s; statuses {r['status_counts']}, "
            f"lost {r['lost']}, 5xx {r['server_errors_5xx']}; 429 P50 {a['p50_ms']} ms P99 {a['p99_ms']} ms "
            f"(sent to answered: P50 {c['p50_ms']} P99 {c['p99_ms']}; the probe's P50 {p['p50_ms']} "
            f"P99 {p['p99_ms']}); "
            f"200 P50 {b['p50_ms']} ms P99 {b['p99_ms']} ms; cpu {r['cpu']}")


def table(paths: list[str]) -> str:
    """Markdown rows of results files: each run with the probe's requests counted in."""
    rows = ["| file | run | offered req/s | served req/s | 429 | 200 | lost | 5xx | 429 P50 / P99 ms | probe's 429 "
            "P50 / P99 ms | 200 P50 / P99 ms | others' CPU % |", "|---" * 12 + "|"]
    for path in paths:
        for i, r in enumerate(json.loads(Path(path).read_text())["runs"]):
            p = r.get("probe") or {"scheduled": 0, "status_counts": {}, "lost": 0, "server_errors_5xx": 0,
                                   "served_rps": 0.0, "latency_429": {"p50_ms": None, "p99_ms": None}}
            n = {k: r["status_counts"].get(k, 0) + p["status_counts"].get(k, 0) for k in ("200", "429")}
            a, b, q = r["latency_429"], r["latency_200"], p["latency_429"]
            rows.append(f"| {Path(path).name} | {i} | {(r['scheduled'] + p['scheduled']) / r['offer_s']:.0f} | "
                        f"{r['served_rps'] + p['served_rps']:.0f} | {n['429']} | {n['200']} | {r['lost'] + p['lost']} | "
                        f"{r['server_errors_5xx'] + p['server_errors_5xx']} | {a['p50_ms']:.2f} / {a['p99_ms']:.1f} | "
                        f"{q['p50_ms']:.2f} / {q['p99_ms']:.1f} | {b['p50_ms']:.0f} / {b['p99_ms']:.0f} | "
                        f"{r['cpu'].get('other_pct', 0):.0f} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=600.0, help="requests offered per second (Poisson)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of offered load per run")
    ap.add_argument("--runs", type=int, default=3, help="runs, each on a fresh server")
    ap.add_argument("--max-tokens", type=int, default=64, help="max_tokens of each request")
    ap.add_argument("--stream", action="store_true", help="streamed answers (SSE)")
    ap.add_argument("--probe-rate", type=float, default=20.0,
                    help="of --rate, the requests a second sent by a second, otherwise idle client process")
    ap.add_argument("--connections", type=int, default=1024, help="keep-alive connections at most")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before an answer counts as lost")
    ap.add_argument("--serve-args", default="", help="more `splitserve serve` options")
    ap.add_argument("--log", default=None, help="the server's log file")
    ap.add_argument("--out", default=str(HERE / "overload_429.json"))
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print these results as Markdown rows, and run nothing")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return 0
    results = {**header("overload_429"), "body": body(args.max_tokens, args.stream), "runs": []}
    t0 = time.perf_counter()
    for i in range(args.runs):
        r = one_run(args, seed=i)
        print(f"run {i}: {line(r)}", flush=True)
        results["runs"].append(r)
    results["wall_s"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
