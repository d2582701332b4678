"""Moving a request's KV cache from its prompt worker to its token worker (paper §IV-C).

Transports share one small interface (`KVTransport`): a worker binds an inbound endpoint
(`address`) for signed messages from its peers, `send`s messages to a peer by id, `put`s K/V
where a peer can read it, polls its inbound messages, and drops a peer that went down.

- `tcp` (`TcpTransport`, the default; works across hosts): the K/V bytes travel inside the
  messages (ZeroMQ over TCP) and the receiver writes them into the blocks it reserved.
- `local` (`LocalTransport`, workers on one host): every worker's KV cache lives in memory its
  peers can map (shm.py: POSIX shared memory on CPU, CUDA IPC on GPU). The prompt worker WRITES
  each layer's K/V straight into the token worker's reserved blocks (a one-sided write, like
  NVLink/RDMA in the paper) and then sends only a small control message over the same ZeroMQ
  channel ("layer i written", the closing `kvd`). The receiver copies nothing. The token worker's
  region handle travels once, in its `hello` (the router keeps it); its block ids for a request
  travel `reserved` -> router -> `gen` (prefill), which also carries the handle, so a writer maps
  a peer's region on first use and maps it again if the peer was restarted. A mapping is dropped
  when the router says `peer_down` for its owner. The CUDA branch has not been run on a GPU yet.
- NCCL is not implemented.

The two ends:
- `KVSender` (prompt worker) hooks every decoder layer. When a prompt batch starts, the policy's
  `choose_mode` picks layer-wise or serialized from the batch's prompt tokens (threshold 512 by
  default, as in the paper). Layer-wise: right after layer i has run, layer i's K/V of every
  prompt finishing in the batch is put (tcp: gathered and sent, ZeroMQ's I/O thread ships it
  while the next layers compute; local: written into the peer's blocks). Serialized: the whole
  cache goes out after the step. Then `kvd` closes the transfer, stamped with the time the
  prefill ended. A plan dropped before its `kvd` (abort, or the request ended at its first
  token) sends `kvx` ("I will not write this request's blocks again") on a one-sided transport.
- `KVReceiver` (token worker) reserves the blocks when the router announces the request
  (`expect`), before any byte is sent, takes each layer as it lands, and starts decoding once
  every layer is in. The deadline is progress-based: `start_s` (default max(30 s, 6 x the
  timeout)) for the prompt worker to begin, then the timeout from the latest sign of progress (a
  `kvs` that the sender puts out as each step of the prompt starts, a layer). A reservation past
  its deadline is reported (`kv_fail`), so a peer that dies mid-transfer leaks nothing on either side (the prompt worker's engine freed its
  blocks when the prefill ended). On tcp its blocks are freed at once. On a one-sided transport a
  writer (the prompt worker the router named in `expect`'s `src`) might still be writing into them
  (stalled, not dead), so they are held until it cannot write any more: its `kvd`/`kvx` for the
  request, the router's word that the prefill was never sent (`abort` with `prefill_sent`
  false) or that the writer is down (`peer_down`); after `hold_s` (default max(30 s, 6 x the
  timeout)) they are freed regardless, and counted (`forced`): a writer stalled that long could
  still write into reused blocks, a risk bounded only by that time.

Per transfer: bytes, seconds (first byte put -> last byte in) and the non-overlapped part
(prefill end -> last byte in), reported to the router in `kv_in`. Times are wall-clock
(`time.time()`) stamps from both hosts: across hosts they include the clock offset.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import zmq

from ..errors import UserError
from ..policy.kv_transfer import TransferMode, choose_mode
from .protocol import BadMessage, Codec, limit_socket

if TYPE_CHECKING:  # torch is imported where K/V is touched: echo workers and the router never do
    import torch

    from .shm import MappedRegion, SharedKVRegion


class TransportUnavailable(UserError):
    """The requested KV transport cannot run here."""


class TransportError(Exception):
    """One transfer cannot proceed (its plan fails; the receiver hears it in `kvd`)."""


@dataclass(slots=True)
class Target:
    """Where one request's KV goes: the peer (its id, and its identity, which our messages are
    signed for), its inbound address, and for a one-sided transport its KV region (a
    RegionHandle on the wire) and the blocks it reserved there."""

    peer: int
    ident: str
    address: str
    region: dict | None = None
    blocks: list[int] | None = None
    slots: torch.Tensor | None = None  # cached destination slot ids (one-sided)


class KVTransport:
    """The one interface of every KV transport (see the module docstring)."""

    name = "abstract"
    address: str
    inbound: zmq.Socket
    region: dict | None = None  # this worker's KV cache as a same-host peer maps it (hello)
    one_sided = False            # peers write K/V into our blocks; messages carry no K/V bytes

    def send(self, target: Target, header: dict, *data) -> bool:
        raise NotImplementedError

    def put(self, target: Target, layer: int | None, kv: torch.Tensor) -> tuple[dict, list]:
        """Make `kv` available to `target`: layer `layer`'s K/V (2, tokens, kv_heads, head_dim),
        or every layer's (layers, 2, tokens, kv_heads, head_dim) when `layer` is None. Returns the
        header fields and data frames of the message that announces it. TransportError when it
        cannot."""
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
    times out on the receiving side. K/V bytes travel in the messages."""

    name = "tcp"

    def __init__(self, ctx: zmq.Context, codec: Codec, host: str = "127.0.0.1",
                 max_message: int = 1 << 30) -> None:
        """max_message: bytes of the largest message part a peer may send (a whole request's KV)."""
        self.ctx, self.codec = ctx, codec
        self.inbound = ctx.socket(zmq.ROUTER)
        self.inbound.setsockopt(zmq.LINGER, 0)
        limit_socket(self.inbound, max_message, hwm=100_000)
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

    def send(self, target: Target, header: dict, *data) -> bool:
        try:
            frames = self.codec.encode(header, *data, to=target.ident)
            self._peer(target.peer, target.address).send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            self.dropped += 1
            return False

    def put(self, target: Target, layer: int | None, kv: torch.Tensor) -> tuple[dict, list]:
        import torch

        buf = kv.detach().contiguous().cpu()
        fields = {}
        if layer is None:
            layers, _, tokens, kvh, hd = buf.shape
            fields["meta"] = {"num_layers": layers, "num_tokens": tokens, "num_kv_heads": kvh, "head_dim": hd,
                              "dtype": str(buf.dtype).removeprefix("torch.")}
        return fields, [buf.view(torch.uint8).numpy()]  # raw bytes: numpy has no bfloat16

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


class LocalTransport(TcpTransport):
    """Workers on one host: `put` writes into the target's KV cache, mapped from its region handle
    (shm.MappedRegion), and the ZeroMQ messages carry only control (`inplace`: bytes written).
    This worker's own cache must have been allocated by `region` (a SharedKVRegion)."""

    name = "local"
    one_sided = True

    def __init__(self, ctx: zmq.Context, codec: Codec, host: str = "127.0.0.1",
                 region: SharedKVRegion | None = None, max_message: int = 1 << 30) -> None:
        if region is None or region.handle is None:
            raise TransportUnavailable("--transport local needs the worker's KV cache in shared memory "
                                       "(a SharedKVRegion); echo workers have none: use --transport tcp")
        super().__init__(ctx, codec, host, max_message)
        self.region = region.handle.to_wire()
        self.mapped: dict[int, MappedRegion] = {}

    def _mapped(self, target: Target) -> MappedRegion:
        from .shm import MappedRegion, RegionHandle, RegionUnavailable

        if target.region is None or target.blocks is None:
            raise TransportError("the token worker sent no KV region or block ids (is it on --transport local?)")
        try:
            handle = RegionHandle.from_wire(target.region)
            m = self.mapped.get(target.peer)
            if m is not None and m.key != handle.key:  # the peer was restarted: a new region
                self.mapped.pop(target.peer).close()
                m = None
            if m is None:
                m = self.mapped[target.peer] = MappedRegion(handle)
        except RegionUnavailable as e:
            raise TransportError(str(e)) from None
        return m

    def _slots(self, target: Target, dst: torch.Tensor, tokens: int) -> torch.Tensor:
        import torch

        if target.slots is None or target.slots.numel() != tokens:
            nb, bs = dst.shape[2] - 1, dst.shape[3]  # the last block is the peer's null block
            blocks = target.blocks
            if len(blocks) * bs < tokens or any(not 0 <= b < nb for b in blocks):
                raise TransportError(f"the token worker's blocks {blocks[:8]}... do not hold {tokens} tokens "
                                     f"in its {nb} blocks")
            with torch.inference_mode(False):  # cached across steps, in and out of inference mode
                target.slots = torch.tensor([blocks[p // bs] * bs + p % bs for p in range(tokens)],
                                            dtype=torch.long, device=dst.device)
        return target.slots

    def put(self, target: Target, layer: int | None, kv: torch.Tensor) -> tuple[dict, list]:
        import torch

        dst = self._mapped(target).tensor
        lead = (dst.shape[0], 2) if layer is None else (2,)
        if (kv.dtype != dst.dtype or tuple(kv.shape[:len(lead)]) != lead
                or tuple(kv.shape[-2:]) != tuple(dst.shape[-2:]) or (layer is not None and layer >= dst.shape[0])):
            raise TransportError(f"KV {tuple(kv.shape)} {kv.dtype} does not fit the token worker's cache "
                                 f"{tuple(dst.shape)} {dst.dtype}")
        tokens = kv.shape[-3]
        slots = self._slots(target, dst, tokens)
        src = kv.to(dst.device)
        if layer is None:
            dst.view(dst.shape[0], 2, -1, *dst.shape[-2:])[:, :, slots] = src
        else:
            dst[layer].view(2, -1, *dst.shape[-2:])[:, slots] = src
        if dst.is_cuda:  # the bytes are in the peer's memory before the message says so
            torch.cuda.current_stream(dst.device).synchronize()
        return {"inplace": kv.numel() * kv.element_size()}, []

    def drop_peer(self, peer: int) -> None:
        super().drop_peer(peer)
        m = self.mapped.pop(peer, None)
        if m is not None:
            m.close()

    def close(self) -> None:
        super().close()
        for p in list(self.mapped):
            self.mapped.pop(p).close()


TRANSPORTS = {"tcp": TcpTransport, "local": LocalTransport}


def make_transport(name: str, ctx: zmq.Context, codec: Codec, host: str,
                   region: SharedKVRegion | None = None, max_message: int = 1 << 30) -> KVTransport:
    if name == "tcp":
        return TcpTransport(ctx, codec, host, max_message)
    if name == "local":
        return LocalTransport(ctx, codec, host, region, max_message)
    raise UserError(f"unknown KV transport {name!r}; use {' or '.join(TRANSPORTS)}")


# ---- prompt side ---------------------------------------------------------------------------
@dataclass(slots=True)
class Outbound:
    target: Target
    threshold: int
    layerwise: bool = False
    sent_at: float = 0.0
    ok: bool = True
    error: str = ""


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

    def plan(self, rid: str, dest: int, dest_ident: str, address: str, threshold: int, region: dict | None = None,
             blocks: list[int] | None = None) -> None:
        self.plans[rid] = Outbound(Target(dest, dest_ident, address, region, blocks), threshold)

    def step_failed(self) -> None:
        """The engine step being streamed raised: nothing of it is sent any more."""
        self._batch = []

    def forget(self, rid: str) -> None:
        """Drop a plan before its `kvd` (abort; the request ended at its first token). On a
        one-sided transport, tell the token worker that its blocks will not be written again."""
        plan = self.plans.pop(rid, None)
        if plan is not None and plan.target.blocks is not None:
            self.transport.send(plan.target, {"t": "kvx", "rid": rid})

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
            if plan is None:
                continue
            # "a step of your prompt starts": the token worker's clock restarts
            self.transport.send(plan.target, {"t": "kvs", "rid": seq.request_id})
            if seq.num_computed + n != len(seq.prompt_ids):
                continue
            plan.layerwise = choose_mode(prompt_tokens, plan.threshold) is TransferMode.LAYERWISE
            if plan.layerwise:
                seq.export_kv = False  # streamed layer by layer: no whole-cache copy at the step's end
                self._batch.append((seq, plan))

    def _put(self, plan: Outbound, layer: int | None, kv: torch.Tensor, header: dict) -> list:
        """Put `kv` for `plan`; the message's data frames ([] and plan.error set on failure)."""
        try:
            fields, frames = self.transport.put(plan.target, layer, kv)
        except TransportError as e:
            plan.error = str(e)
            return []
        header.update(fields)
        return frames

    def _send_layer(self, i: int) -> None:
        eng = self.engine
        kv = eng.kv
        for seq, plan in self._batch:
            if plan.error:
                continue
            n = len(seq.prompt_ids)
            slots = kv.slots(eng.blocks.block_table(seq.request_id), 0, n)
            flat = kv.data[i].view(2, -1, kv.num_kv_heads, kv.head_dim)
            if i == 0:
                plan.sent_at = time.time()
            header = {"t": "kvl", "rid": seq.request_id, "layer": i, "sent": plan.sent_at}
            frames = self._put(plan, i, flat[:, slots], header)
            if not plan.error:
                plan.ok &= self.transport.send(plan.target, header, *frames)

    def prefill_done(self, rid: str, first_token: int, kv) -> dict | None:
        """After the step that finished `rid`'s prompt: the serialized put (if it was not
        streamed) and the closing message. Returns the transfer's figures as the sender sees them."""
        self._batch = []
        plan = self.plans.pop(rid, None)
        if plan is None:
            return None
        end = time.time()
        header = {"t": "kvd", "rid": rid, "first": first_token, "end": end,
                  "mode": "layerwise" if plan.layerwise else "serialized"}
        data = []
        if not plan.layerwise and kv is not None and not plan.error:
            plan.sent_at = end
            data = self._put(plan, None, kv.data, header)
        if plan.error:
            header["fail"] = plan.error
            data = []
        header["sent"] = plan.sent_at or end
        plan.ok &= self.transport.send(plan.target, header, *data)
        return {"ok": plan.ok and not plan.error, "mode": header["mode"], "error": plan.error}


# ---- token side ----------------------------------------------------------------------------
@dataclass(slots=True)
class Inbound:
    rid: str
    prompt_ids: list[int]
    params: object
    layers: int
    deadline: float
    writer: int | None = None  # the prompt worker the router named (one-sided: it writes the blocks)
    got: set = field(default_factory=set)
    nbytes: int = 0
    sent_at: float = 0.0


@dataclass(slots=True)
class Held:
    """Blocks of a dropped one-sided transfer whose writer may still write into them."""

    writer: int | None
    until: float  # monotonic: freed then whatever happens


class KVReceiver:
    def __init__(self, engine, timeout_s: float, one_sided: bool = False, hold_s: float | None = None,
                 start_s: float | None = None) -> None:
        self.engine, self.timeout_s, self.one_sided = engine, timeout_s, one_sided
        # how long a reservation waits for its prompt worker's first step (queueing included)
        self.start_s = start_s if start_s is not None else max(30.0, 6 * timeout_s)
        self.hold_s = hold_s if hold_s is not None else max(30.0, 6 * timeout_s)
        self.inbound: dict[str, Inbound] = {}
        self.held: dict[str, Held] = {}
        self.stray = 0   # KV messages for no live reservation (late, after a timeout or abort)
        self.forced = 0  # held blocks freed at hold_s without the writer's word

    def expect(self, rid: str, prompt_ids: list[int], params, writer: int | None = None,
               isolated: bool = False) -> list[int] | None:
        """Reserve blocks now and return their ids; raises UserError when they do not fit."""
        table = self.engine.reserve_kv(prompt_ids, params, rid, isolated)
        self.inbound[rid] = Inbound(rid, prompt_ids, params, self.engine.cfg.num_layers,
                                    time.monotonic() + max(self.start_s, self.timeout_s), writer)
        return table

    def _free(self, rid: str) -> bool:
        self.inbound.pop(rid, None)
        self.held.pop(rid, None)
        return self.engine.release_kv(rid)

    def _drop(self, inb: Inbound, may_write: bool) -> None:
        """Stop waiting for `inb`: free its blocks, or hold them while a one-sided writer may still
        write into them."""
        del self.inbound[inb.rid]
        if self.one_sided and may_write:
            self.held[inb.rid] = Held(inb.writer, time.monotonic() + self.hold_s)
        else:
            self.engine.release_kv(inb.rid)

    def release(self, rid: str, prefill_sent: bool = True) -> bool:
        """The router dropped the request (abort, cancel). `prefill_sent`: its prompt worker was
        given the blocks (so, one-sided, it may still write into them until it says so)."""
        inb = self.inbound.get(rid)
        if inb is not None:
            self._drop(inb, prefill_sent)
            return True
        if rid in self.held and not prefill_sent:
            return self._free(rid)
        return False

    def peer_down(self, peer: int) -> None:
        """`peer` is dead: it writes nothing any more. Free what waited on it (the router restarts
        its requests)."""
        for rid in [r for r, h in self.held.items() if h.writer == peer]:
            self._free(rid)
        for rid in [r for r, i in self.inbound.items() if i.writer == peer and self.one_sided]:
            self._free(rid)

    def handle(self, header: dict, data: list) -> dict | None:
        """One KV message; returns a `kv_in` or `kv_fail` event for the router when the transfer
        ends."""
        import torch

        rid = header.get("rid")
        kind = header.get("t")
        inb = self.inbound.get(rid)
        if inb is None:
            self.stray += 1
            if rid in self.held and kind in ("kvd", "kvx"):
                self._free(rid)  # its writer is done with the blocks
            return None
        eng = self.engine
        if kind == "kvx":  # the writer stopped for good (the router aborts or cancels the request)
            self._free(rid)
            return None
        inb.deadline = time.monotonic() + self.timeout_s  # progress: a prompt step began, a layer came
        if kind == "kvs":
            return None
        if kind == "kvl":
            layer = int(header["layer"])
            if data:
                buf = data[0]
                t = torch.frombuffer(bytearray(buf), dtype=eng.kv.data.dtype).view(
                    2, len(inb.prompt_ids), eng.kv.num_kv_heads, eng.kv.head_dim)
                eng.write_kv_layer(inb.rid, layer, t)
                inb.nbytes += len(buf)
            elif self.one_sided and "inplace" in header:
                inb.nbytes += int(header["inplace"])  # already in our blocks
            else:
                self.stray += 1
                return None
            inb.got.add(layer)
            inb.sent_at = inb.sent_at or float(header["sent"])
            return None
        if kind != "kvd":
            return None
        if "fail" in header:
            self._free(rid)
            return {"t": "kv_fail", "rid": rid, "reason": f"the prompt worker could not put the KV: {header['fail']}"}
        if data:
            from ..engine.kv_cache import KVExport

            kv = KVExport.from_bytes(header["meta"], data[0])
            if kv.num_tokens != len(inb.prompt_ids) or kv.num_layers != inb.layers:
                self._free(rid)
                return {"t": "kv_fail", "rid": rid, "reason": "KV shape does not match the request"}
            for i in range(kv.num_layers):
                eng.write_kv_layer(inb.rid, i, kv.layer(i))
                inb.got.add(i)
            inb.nbytes += len(data[0])
        elif self.one_sided and "inplace" in header:
            inb.got.update(range(inb.layers))  # every layer written in place
            inb.nbytes += int(header["inplace"])
        inb.sent_at = inb.sent_at or float(header["sent"])
        if len(inb.got) != inb.layers:
            self._free(rid)
            return {"t": "kv_fail", "rid": rid,
                    "reason": f"transfer incomplete: {len(inb.got)} of {inb.layers} layers arrived"}
        del self.inbound[rid]
        try:
            eng.start_reserved(inb.rid, int(header["first"]))
        except UserError as e:
            eng.release_kv(inb.rid)
            return {"t": "kv_fail", "rid": rid, "reason": str(e)}
        now = time.time()
        return {"t": "kv_in", "rid": rid, "first": int(header["first"]), "bytes": inb.nbytes, "mode": header["mode"],
                "seconds": max(now - inb.sent_at, 0.0), "exposed": max(now - float(header["end"]), 0.0)}

    def expire(self) -> list[dict]:
        """Report every reservation past its deadline (the sender died or the link failed), and
        free it (tcp) or hold it until its writer is done (one-sided); free holds past hold_s."""
        now = time.monotonic()
        out = []
        for inb in [i for i in self.inbound.values() if i.deadline < now]:
            self._drop(inb, may_write=True)
            out.append({"t": "kv_fail", "rid": inb.rid,
                        "reason": f"KV transfer timed out after {self.timeout_s:g} s"})
        for rid in [r for r, h in self.held.items() if h.until < now]:
            self._free(rid)
            self.forced += 1
        return out
