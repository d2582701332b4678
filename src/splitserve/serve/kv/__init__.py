"""Moving a request's KV cache from its prompt worker to its token worker (paper §IV-C).

The engine sees none of this: it calls its KV connector (engine/kv_connector.py, the contract),
and a serving worker's connector is `BothSides(KVSender, KVReceiver)` over one transport:

    transports.py  the sockets and puts: tcp (K/V bytes in the messages) and local (one-sided
                   writes into a same-host peer's shared KV cache)
    collective.py  nccl: K/V by torch.distributed send/recv (NCCL on CUDA, gloo on CPU) over a
                   two-rank group per pair of workers (pairs.py), control as on tcp
    factory.py     TRANSPORTS by name, `make_transport`
    sender.py      KVSender, the prompt side: plans, `kvs` as each prompt step starts, layer-wise
                   or serialized puts, the closing `kvd`, `kvx` for a dropped one-sided plan
    receiver.py    KVReceiver, the token side: reservations, progress-based deadlines, one-sided
                   holds, and the `kv_in` / `kv_fail` events for the router

Worker-to-worker messages are messages.py's KvStart (kvs), KvLayer (kvl), KvDone (kvd) and
KvDrop (kvx), signed by protocol.py's Codec.
"""

from ...engine.kv_connector import BothSides
from .receiver import KVReceiver
from .sender import KVSender
from .collective import CollectiveTransport
from .factory import TRANSPORTS, make_transport
from .transports import (KVTransport, LocalTransport, Put, Target, TcpTransport, TransportError,
                         TransportUnavailable)

__all__ = ["TRANSPORTS", "BothSides", "CollectiveTransport", "KVReceiver", "KVSender", "KVTransport",
           "LocalTransport", "Put", "Target", "TcpTransport", "TransportError", "TransportUnavailable",
           "make_transport"]
