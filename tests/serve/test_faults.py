"""Failures: a token worker killed mid-generation, a prompt worker killed mid-transfer, a transfer
that times out. Clients get complete, correct answers (or a clear error), the cluster keeps
serving, dead workers are replaced, and no KV block leaks on any live worker."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx

from .conftest import complete, reference


def wait_for(cond, timeout: float = 15.0, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(step)
    raise AssertionError("condition not met in time")


def test_kill_token_worker_mid_generation(split_2x2_server, reference_engine):
    srv = split_2x2_server
    prompts = [[(11 * i + j) % 250 + 3 for j in range(5 + 9 * i)] for i in range(12)]
    max_tokens = [300] * len(prompts)
    want = reference(reference_engine, prompts, max_tokens, ignore_eos=True)
    restarts0 = srv.metric("splitserve_request_restarts_total")

    async def run():
        async with httpx.AsyncClient(timeout=60) as client:
            tasks = [asyncio.create_task(complete(client, srv.url, p, m, stream=True, ignore_eos=True))
                     for p, m in zip(prompts, max_tokens)]
            victim = None
            deadline = time.monotonic() + 20
            while victim is None and time.monotonic() < deadline:  # some decoding has begun
                await asyncio.sleep(0.05)
                st = (await client.get(srv.url + "/debug/state")).json()
                busy = [w for w in st["workers"] if w["home"] == "token" and w["up"] and w["running"] >= 2]
                if busy:
                    victim = busy[0]
            assert victim is not None
            os.kill(victim["pid"], signal.SIGKILL)
            return victim, await asyncio.gather(*tasks)

    victim, results = asyncio.run(run())
    completed = 0
    for (status, toks, last), w in zip(results, want):
        if status == 200:
            assert toks == w  # complete and correct, restarted on the other token worker
            completed += 1
        else:
            assert last["error"]["message"]  # or a clear error
    assert completed == len(prompts)
    assert srv.metric("splitserve_request_restarts_total") > restarts0
    # the dead worker is replaced, and the cluster serves again
    st = wait_for(lambda: (s := srv.state()) and all(w["up"] for w in s["workers"]) and s)
    w = st["workers"][victim["id"]]
    assert w["restarts"] == 1 and w["pid"] != victim["pid"]
    status, toks, _ = asyncio.run(_one(srv.url, prompts[0], 20))
    assert status == 200 and toks == want[0][:20]
    st = srv.wait_settled()
    for w in st["workers"]:
        assert w["free"] == w["start_free"] and w["reserved"] == 0, w
    assert st["policy_idle"]


async def _one(url, prompt, n):
    async with httpx.AsyncClient(timeout=60) as client:
        return await complete(client, url, prompt, n, stream=False, ignore_eos=True)


def test_prompt_worker_dies_during_layerwise_transfer(server_factory, reference_engine):
    # each prefill layer takes 0.5 s on the prompt workers: layer 0's KV is at the token worker
    # (its blocks reserved) while layer 1 is still "computing" when the prompt worker is killed
    srv = server_factory("--prompt-workers", "2", "--token-workers", "1", "--layerwise-threshold", "0",
                         "--debug-layer-delay", "0.5", "--transfer-timeout", "2")
    prompt = list(range(10, 50))
    want = reference(reference_engine, [prompt], [8], ignore_eos=True)[0]
    token = next(w for w in srv.state()["workers"] if w["home"] == "token")

    async def run():
        async with httpx.AsyncClient(timeout=60) as client:
            task = asyncio.create_task(complete(client, srv.url, prompt, 8, stream=True, ignore_eos=True))
            victim = None
            deadline = time.monotonic() + 20
            while victim is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                st = (await client.get(srv.url + "/debug/state")).json()
                t = st["workers"][token["id"]]
                # the prompt worker is inside its step (no heartbeats then): ask the policy state
                busy = [st["workers"][m["id"]] for m in st["machines"]
                        if m["home"] == "prompt" and m["prefill_tokens_running"]]
                if t["reserved"] == 1 and t["free"] < t["start_free"] and busy:
                    victim = busy[0]
            assert victim is not None
            await asyncio.sleep(0.2)  # inside the layer-0 delay: mid-transfer
            os.kill(victim["pid"], signal.SIGKILL)
            return await task

    status, toks, _ = asyncio.run(run())
    assert status == 200 and toks == want
    st = srv.wait_settled()
    for w in st["workers"]:
        assert w["free"] == w["start_free"] and w["reserved"] == 0, w
    assert st["policy_idle"]


def test_transfer_timeout_frees_blocks_on_both_sides(reference_engine):
    """In process: the token side's reservation expires and is freed; the prompt side's engine
    holds nothing once its prefill is done, even when its peer never answers."""
    import zmq

    from splitserve.engine.engine import EngineConfig, LLMEngine
    from splitserve.engine.sampler import SamplingParams
    from splitserve.serve.kv import KVReceiver, KVSender, TcpTransport
    from splitserve.serve.protocol import Codec

    params = SamplingParams(max_tokens=4, ignore_eos=True)
    prompt = list(range(20, 60))
    tok = LLMEngine("tiny", EngineConfig(num_blocks=64, tokenizer=None))
    free0 = tok.blocks.num_free
    events = []
    tok.connector = rx = KVReceiver(timeout_s=0.2, notify=events.append)
    assert rx.expect("r1", prompt, params) == {"skip": 0}  # tcp: no blocks for the writer; none of it cached
    assert tok.blocks.num_free == free0 - tok.blocks.blocks_for(len(prompt) + 1)

    # a prompt worker streams layer 0 to a peer that is gone (nobody listens there)
    ctx = zmq.Context()
    codec = Codec(b"0123456789abcdef0123456789abcdef", "w")  # both ends in one process
    tx = TcpTransport(ctx, codec)
    pr = LLMEngine("tiny", EngineConfig(num_blocks=64, tokenizer=None))
    pfree0 = pr.blocks.num_free
    pr.connector = sender = KVSender(tx)
    sender.plan("r1", 99, "w", "tcp://127.0.0.1:1", threshold=0)
    first = pr.prefill_only(prompt, params, request_id="r1")  # the engine sends the kvd
    assert pr.blocks.num_free == pfree0 and not sender.plans  # the prompt side freed its blocks after the prefill
    tx.drop_peer(99)                              # the router said the peer is down: queue dropped
    assert 99 not in tx.peers

    # the token side got layer 0 only, then nothing: the reservation expires and is freed
    assert first.kv is None                       # streamed layer by layer: no whole-cache copy
    kv = LLMEngine("tiny", EngineConfig(num_blocks=64, tokenizer=None)).prefill_only(prompt, params).kv
    layer0 = kv.layer(0).contiguous().numpy()
    rx.handle({"t": "kvl", "rid": "r1", "layer": 0, "sent": time.time()}, [memoryview(layer0).cast("B")])
    assert rx.inbound["r1"].got == {0} and events == []
    assert rx.expire() == 0
    time.sleep(0.25)
    assert rx.expire() == 1
    (ev,) = events
    assert ev.T == "kv_fail" and "timed out" in ev.reason
    assert not tok.has_unfinished()  # the engine hears of it before it steps
    assert tok.blocks.num_free == free0 and tok.kv_host.num_reserved == 0
    tok.blocks.check()
    # a late message for the expired transfer is ignored
    rx.handle({"t": "kvd", "rid": "r1", "first": first.token, "end": 0, "sent": 0, "mode": "layerwise"}, [])
    assert rx.stray == 1 and tok.blocks.num_free == free0 and len(events) == 1
    tx.close()
    ctx.destroy(linger=0)


def test_complete_transfer_in_process_matches_engine(reference_engine):
    """Both transfer modes through the real sender/receiver code in one process."""
    import zmq

    from splitserve.engine.engine import EngineConfig, LLMEngine
    from splitserve.engine.sampler import SamplingParams
    from splitserve.serve.kv import KVReceiver, KVSender, TcpTransport
    from splitserve.serve.protocol import Codec

    params = SamplingParams(max_tokens=6, ignore_eos=True)
    prompt = list(range(30, 80))
    want = reference(reference_engine, [prompt], [6], ignore_eos=True)[0]
    ctx = zmq.Context()
    codec = Codec(b"0123456789abcdef0123456789abcdef", "w")  # both ends in one process
    for thr, mode in ((0, "layerwise"), (10_000, "serialized")):
        a, b = TcpTransport(ctx, codec), TcpTransport(ctx, codec)
        pr, tok = (LLMEngine("tiny", EngineConfig(num_blocks=64, tokenizer=None)),
                   LLMEngine("tiny", EngineConfig(num_blocks=64, tokenizer=None)))
        events = []
        tok.connector = rx = KVReceiver(timeout_s=5, notify=events.append)
        rx.expect("r", prompt, params)
        pr.connector = sender = KVSender(a)
        sender.plan("r", 1, "w", b.address, threshold=thr)
        first = pr.prefill_only(prompt, params, request_id="r")
        deadline = time.monotonic() + 5
        while not events and time.monotonic() < deadline:
            for h, data in b.recv_all():
                rx.handle(h, data)
            tok.has_unfinished()  # the engine starts what landed: kv_in
            time.sleep(0.005)
        (ev,) = events
        assert ev.T == "kv_in" and ev.mode == mode and ev.nbytes == 512 * len(prompt)
        assert ev.exposed <= ev.seconds + 1e-6 or mode == "serialized"
        out = [first.token]
        while tok.has_unfinished():
            for o in tok.step():
                out += o.new_token_ids
        assert out == want
        a.close()
        b.close()
    ctx.destroy(linger=0)


def test_prompt_steps_longer_than_the_timeouts_are_served(server_factory, reference_engine):
    """A prompt step of 2.4 s (two layers, 1.2 s each) outlasts both the worker's 1.5 s orphan
    timeout and the 2 s transfer timeout, yet nothing fails: the worker reads the router's queued
    pings before judging it lost, and the transfer's clock runs from its latest progress (the
    step's start, each layer), never idle for 2 s."""
    srv = server_factory("--prompt-workers", "1", "--token-workers", "1", "--layerwise-threshold", "0",
                         "--debug-layer-delay", "1.2", "--transfer-timeout", "2", "--orphan-timeout", "1.5")
    prompt = list(range(40, 70))
    want = reference(reference_engine, [prompt], [5], ignore_eos=True)[0]
    pids = {w["id"]: w["pid"] for w in srv.state()["workers"]}
    t0 = time.monotonic()
    status, toks, _ = asyncio.run(_one(srv.url, prompt, 5))
    assert time.monotonic() - t0 > 2.4
    assert status == 200 and toks == want
    assert srv.metric("splitserve_kv_transfer_failures_total") == 0
    assert srv.metric("splitserve_request_restarts_total") == 0
    assert srv.metric("splitserve_kv_transfers_total", mode="layerwise") == 1
    time.sleep(2)  # a worker that took its router for lost would exit right after the step
    status, toks, _ = asyncio.run(_one(srv.url, prompt, 5))
    assert status == 200 and toks == want
    assert srv.metric("splitserve_worker_restarts_total") == 0
    st = srv.wait_settled()
    assert {w["id"]: w["pid"] for w in st["workers"]} == pids and all(w["up"] for w in st["workers"])
