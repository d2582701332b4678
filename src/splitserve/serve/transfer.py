"""Moving a request's KV cache from its prompt worker to its token worker (paper §IV-C).

Transports share one small interface (`KVTransport`): a worker binds an inbound endpoint
(`address`), sends signed messages to a peer by id, polls its inbound messages, and drops a peer
that went down. `TcpTransport` (the default; ZeroMQ over TCP, works across hosts) is the only
implemented one. `CudaIpcTransport` and `NcclTransport` are STUBS: constructing one raises
`TransportUnavailable`; they are not implemented.

The two ends:
- `KVSender` (prompt worker) hooks every decoder layer. When a prompt batch starts, the policy's
  `choose_mode` picks layer-wise or serialized from the batch's prompt tokens (threshold 512 by
  default, as in the paper). Layer-wise: right after layer i has run, layer i's K/V of every
  prompt finishing in the batch is gathered and sent (ZeroMQ's I/O thread ships it while the
  next layers compute). Serialized: the whole cache goes out after the step. Then `kvd` closes
  the transfer, stamped with the time the prefill ended.
- `KVReceiver` (token worker) reserves the blocks when the router announces the request
  (`expect`), before any byte is sent, writes each layer into them as it lands, and starts
  decoding once every layer is in. A reservation not completed by its deadline is freed and
  reported (`kv_fail`), so a peer that dies mid-transfer leaks nothing on either side (the
  prompt worker's engine freed its blocks when the prefill ended).

Per transfer: bytes, seconds (first byte sent -> last byte in) and the non-overlapped part
(prefill end -> last byte in), reported to the router in `kv_in`. Times are wall-clock
(`time.time()`) stamps from both hosts: across hosts they include the clock offset.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import zmq

from ..errors import UserError
from ..policy.kv_transfer import TransferMode, choose_mode
from .protocol import BadMessage, Codec


class TransportUnavailable(UserError):
    """The requested KV transport cannot run here."""


class KVTransport:
    name = "abstract"
    address: str

    def send(self, peer: int, address: str, header: dict, *data) -> bool:
        raise NotImplementedError

    def recv_all(self) -> list[tuple[dict, list]]:
        raise NotImplementedError

    def drop_peer(self, peer: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class TcpTransport(KVTransport):
    """A ROUTER socket bound on `host` receives; one DEALER per peer sends. Sends never block: a
    peer that cannot take more (down, or its queue full) loses the message and its transfer
    times out on the receiving side."""

    name = "tcp"

    def __init__(self, ctx: zmq.Context, codec: Codec, host: str = "127.0.0.1") -> None:
        self.ctx, self.codec = ctx, codec
        self.inbound = ctx.socket(zmq.ROUTER)
        self.inbound.setsockopt(zmq.LINGER, 0)
        self.inbound.setsockopt(zmq.RCVHWM, 0)
        port = self.inbound.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self.peers: dict[int, zmq.Socket] = {}
        self.dropped = 0

    def _peer(self, peer: int, address: str) -> zmq.Socket:
        s = self.peers.get(peer)
        if s is None:
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 100_000)
            s.setsockopt(zmq.IMMEDIATE, 0)
            s.connect(address)
            self.peers[peer] = s
        return s

    def send(self, peer: int, address: str, header: dict, *data) -> bool:
        try:
            self._peer(peer, address).send_multipart(self.codec.encode(header, *data), flags=zmq.NOBLOCK,
                                                     copy=False)
            return True
        except zmq.Again:
            self.dropped += 1
            return False

    def recv_all(self) -> list[tuple[dict, list]]:
        out = []
        while True:
            try:
                frames = self.inbound.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return out
            try:
                out.append(self.codec.decode(frames[1:]))  # frames[0]: the sender's identity
            except BadMessage:
                pass  # counted by the codec

    def drop_peer(self, peer: int) -> None:
        s = self.peers.pop(peer, None)
        if s is not None:
            s.close(linger=0)  # discards whatever was still queued for it

    def close(self) -> None:
        for p in list(self.peers):
            self.drop_peer(p)
        self.inbound.close(linger=0)


class CudaIpcTransport(KVTransport):
    """STUB. Workers on one host would share GPU buffers through CUDA IPC handles. Not implemented."""

    name = "cuda-ipc"

    def __init__(self, *args, **kwargs) -> None:
        raise TransportUnavailable("the CUDA IPC KV transport is not available on this machine "
                                   "(not implemented in this build; use --transport tcp)")


class NcclTransport(KVTransport):
    """STUB. GPU-to-GPU sends over NCCL. Not implemented."""

    name = "nccl"

    def __init__(self, *args, **kwargs) -> None:
        raise TransportUnavailable("the NCCL KV transport is not available on this machine "
                                   "(not implemented in this build; use --transport tcp)")


TRANSPORTS = {"tcp": TcpTransport, "cuda-ipc": CudaIpcTransport, "nccl": NcclTransport}


def make_transport(name: str, ctx: zmq.Context, codec: Codec, host: str) -> KVTransport:
    if name not in TRANSPORTS:
        raise UserError(f"unknown KV transport {name!r}; use {', '.join(TRANSPORTS)}")
    return TRANSPORTS[name](ctx, codec, host)


# ---- prompt side ---------------------------------------------------------------------------
@dataclass(slots=True)
class Outbound:
    dest: int
    address: str
    threshold: int
    layerwise: bool = False
    sent_at: float = 0.0
    ok: bool = True


class KVSender:
    def __init__(self, engine, transport: KVTransport, layer_delay_s: float = 0.0) -> None:
        self.engine, self.transport = engine, transport
        self.plans: dict[str, Outbound] = {}
        self.layer_delay_s = layer_delay_s  # tests only: a slow prefill, to kill a peer mid-transfer
        self._batch: list = []  # (sequence, plan) of prompts finishing in the running step
        model = getattr(engine, "model", None)
        if model is not None:
            for i, layer in enumerate(model.layers):
                layer.register_forward_hook(self._hook(i))

    def plan(self, rid: str, dest: int, address: str, threshold: int) -> None:
        self.plans[rid] = Outbound(dest, address, threshold)

    def forget(self, rid: str) -> None:
        self.plans.pop(rid, None)

    def _hook(self, i: int):
        def hook(module, args, output):
            if i == 0:
                self._start_batch()
            if self._batch:
                self._send_layer(i)
                if self.layer_delay_s:
                    time.sleep(self.layer_delay_s)
        return hook

    def _start_batch(self) -> None:
        batch = self.engine.current_batch
        prompt_tokens = sum(n for _, n in batch if n > 1)
        self._batch = []
        for seq, n in batch:
            plan = self.plans.get(seq.request_id)
            if plan is None or seq.num_computed + n != len(seq.prompt_ids):
                continue
            plan.layerwise = choose_mode(prompt_tokens, plan.threshold) is TransferMode.LAYERWISE
            if plan.layerwise:
                self._batch.append((seq, plan))

    def _send_layer(self, i: int) -> None:
        eng = self.engine
        kv = eng.kv
        for seq, plan in self._batch:
            n = len(seq.prompt_ids)
            slots = kv.slots(eng.blocks.block_table(seq.request_id), 0, n)
            flat = kv.data[i].view(2, -1, kv.num_kv_heads, kv.head_dim)
            buf = flat[:, slots].contiguous().cpu().numpy()
            if i == 0:
                plan.sent_at = time.time()
            plan.ok &= self.transport.send(plan.dest, plan.address,
                                           {"t": "kvl", "rid": seq.request_id, "layer": i,
                                            "sent": plan.sent_at}, buf)

    def prefill_done(self, rid: str, first_token: int, kv) -> dict | None:
        """After the step that finished `rid`'s prompt: the serialized send (if it was not
        streamed) and the closing message. Returns the transfer's figures as the sender sees them."""
        self._batch = []
        plan = self.plans.pop(rid, None)
        if plan is None:
            return None
        end = time.time()
        header = {"t": "kvd", "rid": rid, "first": first_token, "end": end,
                  "mode": "layerwise" if plan.layerwise else "serialized"}
        data = []
        if not plan.layerwise and kv is not None:
            plan.sent_at = end
            header["meta"] = kv.metadata()
            data = [kv.data.cpu().contiguous().numpy()]
        header["sent"] = plan.sent_at or end
        plan.ok &= self.transport.send(plan.dest, plan.address, header, *data)
        return {"ok": plan.ok, "mode": header["mode"]}


# ---- token side ----------------------------------------------------------------------------
@dataclass(slots=True)
class Inbound:
    rid: str
    prompt_ids: list[int]
    params: object
    layers: int
    deadline: float
    got: set = field(default_factory=set)
    nbytes: int = 0
    sent_at: float = 0.0


class KVReceiver:
    def __init__(self, engine, timeout_s: float) -> None:
        self.engine, self.timeout_s = engine, timeout_s
        self.inbound: dict[str, Inbound] = {}
        self.stray = 0  # KV messages for no live reservation (late, after a timeout or abort)

    def expect(self, rid: str, prompt_ids: list[int], params) -> None:
        """Reserve blocks now; raises UserError when they do not fit."""
        self.engine.reserve_kv(rid, len(prompt_ids))
        self.inbound[rid] = Inbound(rid, prompt_ids, params, self.engine.cfg.num_layers,
                                    time.monotonic() + self.timeout_s)

    def release(self, rid: str) -> bool:
        self.inbound.pop(rid, None)
        return self.engine.release_kv(rid)

    def handle(self, header: dict, data: list) -> dict | None:
        """One KV message; returns a `kv_in` or `kv_fail` event for the router when the transfer
        ends."""
        import torch

        inb = self.inbound.get(header.get("rid"))
        if inb is None:
            self.stray += 1
            return None
        eng = self.engine
        kind = header["t"]
        if kind == "kvl":
            layer = int(header["layer"])
            buf = data[0]
            t = torch.frombuffer(bytearray(buf), dtype=eng.kv.data.dtype).view(
                2, len(inb.prompt_ids), eng.kv.num_kv_heads, eng.kv.head_dim)
            eng.write_kv_layer(inb.rid, layer, t)
            inb.got.add(layer)
            inb.nbytes += len(buf)
            inb.sent_at = inb.sent_at or float(header["sent"])
            return None
        if kind != "kvd":
            return None
        if data:
            from ..engine.kv_cache import KVExport

            kv = KVExport.from_bytes(header["meta"], data[0])
            if kv.num_tokens != len(inb.prompt_ids) or kv.num_layers != inb.layers:
                self.release(inb.rid)
                return {"t": "kv_fail", "rid": inb.rid, "reason": "KV shape does not match the request"}
            for i in range(kv.num_layers):
                eng.write_kv_layer(inb.rid, i, kv.layer(i))
                inb.got.add(i)
            inb.nbytes += len(data[0])
        inb.sent_at = inb.sent_at or float(header["sent"])
        if len(inb.got) != inb.layers:
            self.release(inb.rid)
            return {"t": "kv_fail", "rid": inb.rid,
                    "reason": f"transfer incomplete: {len(inb.got)} of {inb.layers} layers arrived"}
        del self.inbound[inb.rid]
        try:
            eng.start_reserved(inb.prompt_ids, int(header["first"]), inb.params, inb.rid)
        except UserError as e:
            eng.release_kv(inb.rid)
            return {"t": "kv_fail", "rid": inb.rid, "reason": str(e)}
        now = time.time()
        return {"t": "kv_in", "rid": inb.rid, "first": int(header["first"]), "bytes": inb.nbytes, "mode": header["mode"],
                "seconds": max(now - inb.sent_at, 0.0), "exposed": max(now - float(header["end"]), 0.0)}

    def expire(self) -> list[dict]:
        """Free every reservation past its deadline (the sender died or the link failed)."""
        now = time.monotonic()
        late = [rid for rid, inb in self.inbound.items() if inb.deadline < now]
        out = []
        for rid in late:
            self.release(rid)
            out.append({"t": "kv_fail", "rid": rid,
                        "reason": f"KV transfer timed out after {self.timeout_s:g} s"})
        return out
