"""`--transport local`: the prompt worker writes K/V straight into the token worker's KV cache,
which lives in shared memory (CPU) or behind a CUDA IPC handle (GPU; those tests skip without
CUDA), and only control messages travel over ZeroMQ.

Live clusters give the same greedy tokens as the engine alone in both transfer modes, leak no KV
block and no /dev/shm segment, survive a prompt worker killed mid-transfer and hold the blocks of
a writer that stalled past the timeout until it is done. In process: two engines hand a request
over through the transport, the receiver's hold rules, and the segments' lifecycle."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
import torch

from .conftest import complete, reference, stop_server
from .test_faults import wait_for
from .test_lossless import assert_serves_like_generate, serve_all, workload

SHM = "/dev/shm"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available: the CUDA IPC "
                                "branch of --transport local needs a GPU")
pytestmark = pytest.mark.skipif(not os.path.isdir(SHM), reason="no /dev/shm (POSIX shared memory) here")


def segments(pids) -> list[str]:
    """/dev/shm segments owned (by name) by any of `pids`."""
    prefixes = tuple(f"splitserve-kv-{p}-" for p in pids)
    return sorted(n for n in os.listdir(SHM) if n.startswith(prefixes))


async def poll_state(client, url, pred, timeout: float, what: str) -> dict:
    """The first /debug/state that `pred` holds for, polled every 20 ms; fails with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    s = None
    while time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        s = (await client.get(url + "/debug/state")).json()
        if pred(s):
            return s
    raise AssertionError(f"{what} within {timeout} s: {s}")


def ready_settled(srv) -> dict:
    wait_for(lambda: all(w["up"] for w in srv.state()["workers"]), timeout=30)  # replacements too
    st = srv.wait_settled()
    for w in st["workers"]:
        assert w["free"] == w["start_free"] and w["reserved"] == 0, w
    assert st["policy_idle"], st["machines"]
    return st


# ---- live clusters ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode,threshold", [("layerwise", "0"), ("serialized", "1000000")])
def test_local_transport_is_lossless_and_leaks_nothing(mode, threshold, server_factory, reference_engine, capsys):
    srv = server_factory("--prompt-workers", "1", "--token-workers", "1", "--transport", "local",
                         "--layerwise-threshold", threshold)
    pids = {w["pid"] for w in srv.state()["workers"]}
    assert len(pids) == 2 and len(segments(pids)) == 2  # each worker's KV cache is one segment

    prompts, max_tokens = workload(24, seed=11)
    assert_serves_like_generate(srv, reference_engine, prompts, max_tokens)

    split = [len(p) for p, m in zip(prompts, max_tokens) if m > 1]  # one-token requests stay put
    other = "serialized" if mode == "layerwise" else "layerwise"
    assert srv.metric("splitserve_kv_transfers_total", mode=mode) == len(split)
    assert srv.metric("splitserve_kv_transfers_total", mode=other) == 0
    assert srv.metric("splitserve_kv_transfer_failures_total") == 0
    # tiny: 2 layers x (K, V) x 2 KV heads x 16 dims x 4 bytes = 512 bytes per prompt token, written in place
    assert srv.metric("splitserve_kv_transfer_bytes_total", mode=mode) == 512 * sum(split)

    # the `splitserve generate` CLI (its own engine, stopping at EOS) agrees too
    from splitserve.cli import main
    for prompt in ([1, 2, 3], list(range(40, 97))):
        assert main(["generate", "--model", "tiny", "--prompt-ids", ",".join(map(str, prompt)),   # the server's
                     "--max-tokens", "10", "--json", "--device", "cpu"]) == 0   # device: weights are drawn on it
        cli = json.loads(capsys.readouterr().out)["token_ids"]
        r = httpx.post(srv.url + "/v1/completions", timeout=30,
                       json={"model": "tiny", "prompt": prompt, "max_tokens": 10, "temperature": 0})
        assert r.json()["choices"][0]["token_ids"] == cli

    ready_settled(srv)
    stop_server(srv)  # a clean shutdown: every worker unlinks its segment
    wait_for(lambda: not segments(pids), timeout=10)


def slow_local_pair(server_factory, layer_delay: float, transfer_timeout: float):
    """A 1P + 1T server on the local transport, every prompt layer-wise and each prefill layer slowed
    by `layer_delay` s; returns it with its prompt and token workers' states."""
    srv = server_factory("--prompt-workers", "1", "--token-workers", "1", "--transport", "local",
                         "--layerwise-threshold", "0", "--debug-layer-delay", str(layer_delay),
                         "--transfer-timeout", str(transfer_timeout))
    workers = srv.state()["workers"]
    return (srv, next(w for w in workers if w["home"] == "prompt"),
            next(w for w in workers if w["home"] == "token"))


def test_local_transport_prompt_worker_killed_mid_transfer(server_factory, reference_engine):
    # 0.5 s per prefill layer: layer 0 is in the token worker's blocks while layer 1 "computes"
    srv, prompt_w, token = slow_local_pair(server_factory, layer_delay=0.5, transfer_timeout=2)
    prompt = list(range(10, 50))
    want = reference(reference_engine, [prompt], [8], ignore_eos=True)[0]
    restarts0 = srv.metric("splitserve_request_restarts_total")

    async def run():
        async with httpx.AsyncClient(timeout=60) as client:
            task = asyncio.create_task(complete(client, srv.url, prompt, 8, stream=True, ignore_eos=True))
            def started(s):
                t = s["workers"][token["id"]]
                busy = [m for m in s["machines"] if m["home"] == "prompt" and m["prefill_tokens_running"]]
                return t["reserved"] == 1 and t["free"] < t["start_free"] and busy

            await poll_state(client, srv.url, started, 20, "the transfer never started")
            await asyncio.sleep(0.2)  # inside the layer-0 delay: mid-transfer
            os.kill(prompt_w["pid"], signal.SIGKILL)
            return await task

    status, toks, _ = asyncio.run(run())
    assert status == 200 and toks == want  # restarted on the replacement prompt worker, completed
    assert srv.metric("splitserve_request_restarts_total") > restarts0
    st = ready_settled(srv)
    assert st["workers"][prompt_w["id"]]["pid"] != prompt_w["pid"]
    # the killed worker's resource tracker unlinked its segment; the token worker's survived the
    # death of a process that had it mapped, and the replacement maps it again:
    wait_for(lambda: not segments([prompt_w["pid"]]), timeout=10)
    assert len(segments([token["pid"]])) == 1
    before = srv.metric("splitserve_kv_transfers_total", mode="layerwise")
    status, toks, _ = asyncio.run(_one(srv.url, prompt, 8))
    assert status == 200 and toks == want
    assert srv.metric("splitserve_kv_transfers_total", mode="layerwise") == before + 1
    ready_settled(srv)


def test_local_transport_stalled_writer_keeps_its_blocks_until_done(server_factory, reference_engine):
    """A prompt worker frozen mid-transfer (SIGSTOP) outlives the token worker's timeout. The
    transfer fails and the request restarts, but the old reservation's blocks stay held (the frozen
    writer could still write into them) until the writer, resumed, says it is done."""
    # 0.4 s per prefill layer; the timeout leaves the restarted attempt room for the resumed
    # writer to finish the old step and run the new one (4 layer delays)
    srv, writer, token = slow_local_pair(server_factory, layer_delay=0.4, transfer_timeout=3.5)
    prompt = list(range(60, 90))
    want = reference(reference_engine, [prompt], [6], ignore_eos=True)[0]
    fails0 = srv.metric("splitserve_kv_transfer_failures_total")
    per_request = -(-(len(prompt) + 1) // 16)  # blocks of one reservation

    async def run():
        async with httpx.AsyncClient(timeout=60) as client:
            task = asyncio.create_task(complete(client, srv.url, prompt, 6, stream=True, ignore_eos=True))
            await poll_state(client, srv.url, lambda s: s["workers"][token["id"]]["reserved"] == 1, 20,
                             "no reservation on the token worker")
            await asyncio.sleep(0.1)  # inside the 0.8 s prefill step: mid-transfer
            os.kill(writer["pid"], signal.SIGSTOP)
            try:
                # timed out, restarted: the held blocks and the new attempt's reservation
                await poll_state(client, srv.url, lambda s: s["workers"][token["id"]]["reserved"] == 2
                                 and srv.metric("splitserve_kv_transfer_failures_total") > fails0, 10,
                                 "no timeout with held blocks")
                await asyncio.sleep(0.3)  # still held while the writer is frozen
                t = (await client.get(srv.url + "/debug/state")).json()["workers"][token["id"]]
                assert t["reserved"] == 2 and t["start_free"] - t["free"] == 2 * per_request, t
            finally:
                os.kill(writer["pid"], signal.SIGCONT)
            return await task

    status, toks, _ = asyncio.run(run())
    assert status == 200 and toks == want
    assert srv.state()["workers"][writer["id"]]["pid"] == writer["pid"]  # never declared dead
    ready_settled(srv)


async def _one(url, prompt, n):
    async with httpx.AsyncClient(timeout=60) as client:
        return await complete(client, url, prompt, n, stream=False, ignore_eos=True)


# ---- in process ------------------------------------------------------------------------------
@pytest.fixture
def zmq_pair():
    import zmq

    from splitserve.serve.protocol import Codec

    ctx = zmq.Context()
    yield ctx, Codec(b"0123456789abcdef0123456789abcdef", "w")  # both ends in one process
    ctx.destroy(linger=0)


@pytest.mark.parametrize("threshold,mode", [(0, "layerwise"), (10_000, "serialized")])
def test_two_engines_hand_over_through_shared_memory(threshold, mode, zmq_pair, reference_engine):
    from splitserve.engine.engine import EngineConfig, LLMEngine
    from splitserve.engine.sampler import SamplingParams
    from splitserve.serve.kv import KVReceiver, KVSender, LocalTransport
    from splitserve.serve.shm import SharedKVRegion

    ctx, codec = zmq_pair
    params = SamplingParams(max_tokens=7, ignore_eos=True)
    prompt = list(range(30, 83))
    want = reference(reference_engine, [prompt], [7], ignore_eos=True)[0]
    ra, rb = SharedKVRegion(), SharedKVRegion()
    a_eng = LLMEngine("tiny", EngineConfig(num_blocks=64, tokenizer=None), kv_alloc=ra)   # prompt side
    b_eng = LLMEngine("tiny", EngineConfig(num_blocks=64, tokenizer=None), kv_alloc=rb)   # token side
    a = LocalTransport(ctx, codec, region=ra, slot_ids=a_eng.kv_host.kv_slot_ids)
    b = LocalTransport(ctx, codec, region=rb, slot_ids=b_eng.kv_host.kv_slot_ids)
    try:
        assert os.path.exists(f"{SHM}/{rb.handle.name}") and b.region["name"] == rb.handle.name
        free0 = b_eng.blocks.num_free
        events, done = [], []
        b_eng.connector = rx = KVReceiver(timeout_s=5, one_sided=True, notify=events.append)
        where = rx.expect("r", prompt, params, writer=0)
        blocks = where["blocks"]
        a_eng.connector = sender = KVSender(a, on_done=done.append)
        sender.plan("r", 1, "w", b.address, threshold, where={"region": b.region, **where})
        first = a_eng.prefill_only(prompt, params, request_id="r")  # the engine closes the transfer
        assert [d["ok"] for d in done] == [True]

        # the K/V is in B's blocks already, before B has read a single message
        slots = b_eng.kv.slots(blocks, 0, len(prompt))
        flat = b_eng.kv.data.view(2, 2, -1, 2, 16)
        assert (first.kv is None) == (mode == "layerwise")  # streamed: no whole-cache copy made
        whole = LLMEngine("tiny", EngineConfig(num_blocks=64, tokenizer=None)).prefill_only(prompt, params).kv
        assert torch.equal(flat[:, :, slots], whole.data)
        frames = 0
        deadline = time.monotonic() + 5
        while not events and time.monotonic() < deadline:
            for h, data in b.recv_all():
                frames += len(data)
                rx.handle(h, data)
            b_eng.has_unfinished()  # the engine starts what landed: kv_in
            time.sleep(0.002)
        assert frames == 0  # only control messages travelled
        (ev,) = events
        assert ev.T == "kv_in" and ev.mode == mode and ev.nbytes == 512 * len(prompt)
        assert ev.seconds >= 0 and ev.exposed >= 0
        out = [first.token]
        while b_eng.has_unfinished():
            for o in b_eng.step():
                out += o.new_token_ids
        assert out == want
        assert b_eng.blocks.num_free == free0 and b_eng.kv_host.num_reserved == 0
        a.drop_peer(1)  # peer_down: the mapping goes
        assert 1 not in a.mapped
    finally:
        a.close()
        b.close()
        ra.close()
        rb.close()
    assert not os.path.exists(f"{SHM}/{ra.handle.name}") and not os.path.exists(f"{SHM}/{rb.handle.name}")


def test_one_sided_receiver_holds_blocks_until_the_writer_is_done():
    from splitserve.engine.engine import EngineConfig, LLMEngine
    from splitserve.engine.sampler import SamplingParams
    from splitserve.serve.kv import KVReceiver

    eng = LLMEngine("tiny", EngineConfig(num_blocks=64, tokenizer=None))
    free0 = eng.blocks.num_free
    params = SamplingParams(max_tokens=4)
    prompt = list(range(5, 40))  # 3 blocks with the first generated token
    events = []
    eng.connector = rx = KVReceiver(timeout_s=0.05, one_sided=True, hold_s=0.3, notify=events.append)

    def synced():  # the engine frees what the receiver lets go when it next looks (before a step)
        eng.kv_host.sync_kv()
        return eng

    # timeout: reported at once, but the blocks stay while writer 3 may still write
    rx.expect("a", prompt, params, writer=3)
    rx.handle({"t": "kvl", "rid": "a", "layer": 0, "sent": time.time(), "inplace": 100}, [])
    time.sleep(0.06)
    assert rx.expire() == 1
    (ev,) = events
    assert ev.T == "kv_fail" and "timed out" in ev.reason
    assert synced().blocks.num_free == free0 - 3 and eng.kv_host.num_reserved == 1
    rx.release("a", prefill_sent=True)          # the router's abort: the writer got the prefill
    assert synced().kv_host.num_reserved == 1
    rx.handle({"t": "kvl", "rid": "a", "layer": 1, "sent": 0, "inplace": 100}, [])  # late: ignored
    assert synced().kv_host.num_reserved == 1 and rx.stray == 1
    rx.handle({"t": "kvx", "rid": "a"}, [])    # the writer dropped its plan: free
    assert synced().blocks.num_free == free0 and eng.kv_host.num_reserved == 0

    # abort before the prefill was sent: nobody can write, free at once
    rx.expect("b", prompt, params, writer=3)
    rx.release("b", prefill_sent=False)
    assert synced().blocks.num_free == free0

    # the writer dies: held and pending reservations it was to write are freed
    rx.expect("c", prompt, params, writer=3)
    rx.expect("d", prompt, params, writer=4)
    rx.expect("e", prompt, params, writer=3)
    rx.release("c")
    assert synced().kv_host.num_reserved == 3
    rx.peer_down(3)
    assert synced().kv_host.num_reserved == 1 and eng.blocks.num_free == free0 - 3
    # a writer that never answers: freed after hold_s, and counted
    rx.release("d")
    assert rx.expire() == 0 and synced().kv_host.num_reserved == 1
    time.sleep(0.35)
    assert rx.expire() == 0 and synced().kv_host.num_reserved == 0 and rx.forced == 1
    assert eng.blocks.num_free == free0
    eng.blocks.check()

    # a writer that failed says so in kvd: freed and reported
    rx.expect("f", prompt, params, writer=3)
    rx.handle({"t": "kvd", "rid": "f", "first": 5, "end": 0, "sent": 0, "mode": "layerwise", "fail": "boom"}, [])
    ev = events[-1]
    assert ev.T == "kv_fail" and "boom" in ev.reason and synced().blocks.num_free == free0

    # a malformed KV message is dropped and counted by reason, never raised
    rx.expect("m", prompt, params, writer=3)
    rx.handle({"t": "kvl", "rid": "m", "sent": 0.0}, [])                            # no layer
    rx.handle({"t": "kvl", "rid": "m", "layer": -1, "sent": 0.0}, [])               # out of range
    rx.handle({"t": "kvl", "rid": "m", "layer": 9, "sent": 0.0, "inplace": 1}, [])  # no such layer
    rx.handle({"t": "kvd", "rid": "m", "first": 1}, [])                             # fields missing
    rx.handle({"t": "nope", "rid": "m"}, [])
    rx.handle({"t": "kvs"}, [])
    assert rx.malformed == {"kvl.layer": 3, "kvd.end": 1, "?.t": 1, "kvs.rid": 1}
    assert "m" in rx.inbound and len(events) == 2  # the reservation still waits
    rx.release("m", prefill_sent=False)
    assert synced().blocks.num_free == free0

    # tcp (not one-sided): the clock runs from the latest progress, and the blocks are freed at once
    eng.connector = tcp = KVReceiver(timeout_s=0.05, start_s=0.3, notify=events.append)
    tcp.expect("g", prompt, params, writer=3)
    time.sleep(0.1)
    assert tcp.expire() == 0                     # waiting for the prompt worker to begin: start_s
    tcp.handle({"t": "kvs", "rid": "g"}, [])     # a step of its prompt starts
    time.sleep(0.03)
    tcp.handle({"t": "kvs", "rid": "g"}, [])     # the next chunk: 0.06 s in, never 0.05 s idle
    time.sleep(0.03)
    assert tcp.expire() == 0 and synced().kv_host.num_reserved == 1
    time.sleep(0.03)
    assert tcp.expire() == 1 and synced().blocks.num_free == free0 and eng.kv_host.num_reserved == 0
    tcp.expect("h", prompt, params, writer=3)    # a prompt worker that never begins
    time.sleep(0.31)
    assert tcp.expire() == 1 and synced().blocks.num_free == free0
    assert [e.T for e in events[2:]] == ["kv_fail", "kv_fail"]


def test_local_transport_refuses_what_it_cannot_write(zmq_pair):
    from splitserve.engine.engine import EngineConfig, LLMEngine
    from splitserve.serve.kv import LocalTransport, Target, TransportError, TransportUnavailable
    from splitserve.serve.shm import SharedKVRegion

    ctx, codec = zmq_pair
    with pytest.raises(TransportUnavailable, match="--transport tcp"):
        LocalTransport(ctx, codec, region=None)
    ra, rb = SharedKVRegion(), SharedKVRegion()
    eng = LLMEngine("tiny", EngineConfig(num_blocks=8, tokenizer=None), kv_alloc=ra)  # its cache: (2, 2, 9, 16, 2, 16)
    rb((2, 2, 9, 16, 2, 16), torch.float32, torch.device("cpu"))
    with pytest.raises(TransportUnavailable, match="kv_slot_ids"):
        LocalTransport(ctx, codec, region=ra)
    a = LocalTransport(ctx, codec, region=ra, slot_ids=eng.kv_host.kv_slot_ids)  # slot ids: the engine's
    addr = "tcp://127.0.0.1:1"

    def to(peer, region, blocks=None):
        return Target(peer, "w", addr, {"region": region, "blocks": blocks})

    try:
        kv = torch.ones(2, 20, 2, 16)
        region = rb.handle.to_wire()
        with pytest.raises(TransportError, match="no KV region"):
            a.put(Target(1, "w", addr), 0, kv)
        with pytest.raises(TransportError, match="no KV region"):
            a.put(to(1, None, [0, 1]), 0, kv)
        with pytest.raises(TransportError, match="do not hold 20 tokens"):
            a.put(to(1, region, [0]), 0, kv)        # one block: 16 tokens
        with pytest.raises(TransportError, match="do not hold"):
            a.put(to(1, region, [0, 8]), 0, kv)     # 8 is the null block
        with pytest.raises(TransportError, match="does not fit"):
            a.put(to(1, region, [0, 1]), 0, kv.double())
        with pytest.raises(TransportError, match="another host"):
            a.put(to(2, {**region, "host": "elsewhere/0"}, [0, 1]), 0, kv)
        rd = SharedKVRegion()
        rd((2, 2, 9, 8, 2, 16), torch.float32, torch.device("cpu"))  # blocks of 8 tokens, ours hold 16
        try:
            with pytest.raises(TransportError, match="hold 8 tokens, ours 16"):
                a.put(to(4, rd.handle.to_wire(), [0, 1, 2]), 0, kv)
        finally:
            a.drop_peer(4)
            rd.close()
        put = a.put(to(1, region, [3, 5]), 1, kv)
        assert put.inplace_bytes == kv.numel() * 4 and put.frames == [] and put.meta is None
        assert rb._shm is not None
        mine = torch.frombuffer(rb._shm.buf, dtype=torch.float32).view(2, 2, 9, 16, 2, 16)
        assert mine[1, :, 3].sum() == 2 * 16 * 32 and mine[1, :, 5, :4].sum() == 2 * 4 * 32
        assert mine[1, :, 5, 4:].sum() == 0 and mine[0].sum() == 0  # nothing else touched
        del mine
        rc = SharedKVRegion()
        rc((2, 2, 9, 16, 2, 16), torch.float32, torch.device("cpu"))
        rc.close()  # its owner exited
        with pytest.raises(TransportError, match="not found"):
            a.put(to(3, rc.handle.to_wire(), [0, 1]), 0, kv)
    finally:
        a.close()
        ra.close()
        rb.close()


def test_segments_are_unlinked_on_close_sigterm_sigkill_and_sweep(tmp_path):
    from multiprocessing import resource_tracker
    from multiprocessing.shared_memory import SharedMemory

    from splitserve.serve.shm import SharedKVRegion, sweep_stale

    # a worker killed with SIGKILL: its resource tracker unlinks the segment
    code = ("import time, torch\n"
            "from splitserve.serve.shm import SharedKVRegion\n"
            "r = SharedKVRegion(); r((1, 2, 3, 16, 2, 16), torch.float32, torch.device('cpu'))\n"
            "print(r.handle.name, flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        name = p.stdout.readline().strip()
        assert name.startswith(f"splitserve-kv-{p.pid}-") and os.path.exists(f"{SHM}/{name}")
    finally:
        p.kill()
        p.wait()
    wait_for(lambda: not os.path.exists(f"{SHM}/{name}"), timeout=10)
    assert "leaked shared_memory" in p.stderr.read()
    p.stderr.close()
    p.stdout.close()

    # SIGTERM: the worker's handler unlinks it itself, then terminates as before
    code = code.replace("print(", "from splitserve.serve.worker import unlink_on_sigterm\n"
                                  "unlink_on_sigterm(r); print(")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    name = p.stdout.readline().strip()
    assert os.path.exists(f"{SHM}/{name}")
    p.terminate()
    _, err = p.communicate(timeout=10)
    assert p.returncode == -signal.SIGTERM and not os.path.exists(f"{SHM}/{name}")
    assert "leaked" not in err, err

    # ... and if the tracker died too, the next region on this host sweeps it
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = SharedMemory(name=f"splitserve-kv-{dead}-0badf00d", create=True, size=4096)
    resource_tracker.unregister(stale._name, "shared_memory")  # as if its tracker were gone
    stale.close()
    live = f"splitserve-kv-{os.getpid()}-"
    r = SharedKVRegion()
    r((1, 2, 2, 16, 2, 16), torch.float32, torch.device("cpu"))
    try:
        assert f"splitserve-kv-{dead}-0badf00d" in r.swept
        assert not os.path.exists(f"{SHM}/splitserve-kv-{dead}-0badf00d")
        assert r.handle.name.startswith(live) and os.path.exists(f"{SHM}/{r.handle.name}")
        assert r.handle.name not in sweep_stale()  # a live owner's segment stays
    finally:
        r.close()
        r.close()  # idempotent
    assert not os.path.exists(f"{SHM}/{r.handle.name}")


def test_tcp_put_sends_raw_bytes_of_any_dtype(zmq_pair):
    from splitserve.serve.kv import Target, TcpTransport

    ctx, codec = zmq_pair
    t = TcpTransport(ctx, codec)
    try:
        kv = torch.arange(2 * 3 * 2 * 16, dtype=torch.float32).view(2, 3, 2, 16).to(torch.bfloat16)
        put = t.put(Target(0, "w", "tcp://127.0.0.1:1"), 0, kv)
        (frame,) = put.frames
        assert put.meta is None and put.inplace_bytes is None and frame.nbytes == kv.numel() * 2
        assert torch.equal(torch.frombuffer(bytearray(frame.tobytes()), dtype=torch.bfloat16).view(2, 3, 2, 16), kv)
        put = t.put(Target(0, "w", "tcp://127.0.0.1:1"), None, kv[None])
        assert put.meta == {"num_layers": 1, "num_tokens": 3, "num_kv_heads": 2, "head_dim": 16,
                            "dtype": "bfloat16"} and len(put.frames) == 1
    finally:
        t.close()


def test_transport_option_is_checked():
    from splitserve.errors import UserError
    from splitserve.serve.config import ServeConfig

    ServeConfig(transport="local").validate()
    ServeConfig(transport="local", backend="ray").validate()  # a local Ray instance: one host
    with pytest.raises(UserError, match="--ray-address.*use --transport tcp"):
        ServeConfig(transport="local", backend="ray", ray_address="10.0.0.5:6379").validate()
    with pytest.raises(UserError, match="echo workers.*--transport tcp"):
        ServeConfig(transport="local", worker_mode="echo").validate()
    ServeConfig(transport="nccl").validate()  # test_kv_collective.py checks its refusals
    with pytest.raises(UserError, match="tcp, local or nccl"):
        ServeConfig(transport="cuda-ipc").validate()
    import splitserve.serve.kv as kv
    assert set(kv.TRANSPORTS) == {"tcp", "local", "nccl"}
    assert not hasattr(kv, "CudaIpcTransport")


# ---- CUDA IPC (skipped without a GPU) --------------------------------------------------------
@pytest.mark.gpu
@needs_cuda
def test_cuda_region_is_written_by_another_process():
    import msgpack

    from splitserve.serve.shm import SharedKVRegion

    r = SharedKVRegion()
    t = r((2, 2, 5, 16, 2, 16), torch.float32, torch.device("cuda"))
    assert r.handle.kind == "cuda"
    code = ("import sys, msgpack, torch\n"
            "from splitserve.serve.shm import RegionHandle\n"
            "from splitserve.serve.shm_map import MappedRegion\n"
            "m = MappedRegion(RegionHandle.from_wire(msgpack.unpackb(sys.stdin.buffer.read())))\n"
            "m.tensor[1, :, 3] = 7.0\n"
            "torch.cuda.current_stream(m.tensor.device).synchronize()\n"
            "print(float(m.tensor.sum()))\n"
            "m.close()\n")
    out = subprocess.run([sys.executable, "-c", code], input=msgpack.packb(r.handle.to_wire()),
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    torch.cuda.synchronize()
    assert float(t[1, :, 3].sum()) == 7.0 * 2 * 16 * 2 * 16 and float(t.sum()) == float(t[1, :, 3].sum())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("graphs", [[], ["--cuda-graphs"]], ids=["eager", "cuda-graphs"])
def test_cuda_local_transport_is_lossless(server_factory, graphs):
    """Tokens equal an eager engine's, with the token worker eager or replaying CUDA graphs."""
    from splitserve.engine.engine import EngineConfig, LLMEngine

    srv = server_factory("--prompt-workers", "1", "--token-workers", "1", "--transport", "local",
                         "--device", "cuda", "--dtype", "float32", "--layerwise-threshold", "0", *graphs,
                         timeout=180)
    prompts, max_tokens = workload(12, seed=5)
    want = reference(LLMEngine("tiny", EngineConfig(device="cuda", dtype="float32")), prompts, max_tokens,
                     ignore_eos=True)
    got = asyncio.run(serve_all(srv.url, prompts, max_tokens))
    assert got == want
    assert srv.metric("splitserve_kv_transfer_failures_total") == 0
    ready_settled(srv)


def test_a_serialized_write_after_a_layerwise_one_reuses_the_mapping(zmq_pair, reference_engine):
    """The peer's region is mapped during the first (layer-wise) write, inside the engine step's
    torch.inference_mode; a later serialized write happens outside it and must still land (it
    used to fail: "Inplace update to inference tensor outside InferenceMode")."""
    from splitserve.engine.engine import EngineConfig, LLMEngine
    from splitserve.engine.sampler import SamplingParams
    from splitserve.serve.kv import KVReceiver, KVSender, LocalTransport
    from splitserve.serve.shm import SharedKVRegion

    ctx, codec = zmq_pair
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    prompts = {"long": list(range(30, 90)), "short": list(range(40, 50))}
    ra, rb = SharedKVRegion(), SharedKVRegion()
    a_eng = LLMEngine("tiny", EngineConfig(num_blocks=64, tokenizer=None), kv_alloc=ra)
    b_eng = LLMEngine("tiny", EngineConfig(num_blocks=64, tokenizer=None), kv_alloc=rb)
    a = LocalTransport(ctx, codec, region=ra, slot_ids=a_eng.kv_host.kv_slot_ids)
    b = LocalTransport(ctx, codec, region=rb, slot_ids=b_eng.kv_host.kv_slot_ids)
    try:
        b_eng.connector = rx = KVReceiver(timeout_s=5, one_sided=True)
        results = []
        a_eng.connector = sender = KVSender(a, on_done=results.append)
        for rid, prompt in prompts.items():  # threshold 20: the long prompt streams, the short one not
            where = rx.expect(rid, prompt, params, writer=0)
            blocks = where["blocks"]
            sender.plan(rid, 1, "w", b.address, 20, where={"region": b.region, **where})
            a_eng.prefill_only(prompt, params, request_id=rid)
            (done,) = results[-1:]
            assert done["rid"] == rid and done["ok"], done
            assert done["mode"] == ("layerwise" if rid == "long" else "serialized")
            whole = LLMEngine("tiny", EngineConfig(num_blocks=64, tokenizer=None)).prefill_only(prompt, params).kv
            slots = b_eng.kv.slots(blocks, 0, len(prompt))
            assert torch.equal(b_eng.kv.data.view(2, 2, -1, 2, 16)[:, :, slots], whole.data)
    finally:
        a.close()
        b.close()
        ra.close()
        rb.close()
