"""Encryption of the cluster's internal ZeroMQ sockets with CURVE (CurveZMQ, RFC 25/ZMTP-CURVE).

Which sockets: the router's control socket (channel.py, a ROUTER every worker's DEALER connects
to) and each worker's inbound KV socket (kv/transports.py, a ROUTER its peers' DEALERs connect
to). The binding side is the CURVE server, the connecting side the client. Every frame after the
handshake is encrypted and authenticated by libzmq (Curve25519 key exchange, XSalsa20-Poly1305
boxes with short-term keys per connection); the signatures of protocol.py stay as they are, so a
message is both encrypted (here) and signed with the cluster secret (there).

Keys, without a new message round: ONE CURVE key pair for the whole cluster, derived from the
cluster secret (keyed BLAKE2b of the secret, personalization "splitserve-curve", 32 bytes -> z85
-> zmq.curve_public). The router makes the secret and hands it to each worker it starts in the
environment (protocol.SECRET_ENV), so every process of the cluster computes the same pair by
itself: servers use it as their long-term key pair, clients as theirs and the server's public key
as the key of the server they connect to. No key is on a command line or on the wire.
Consequences:
- Anyone who holds the cluster secret can derive the key and decrypt recorded traffic whose
  short-term keys they also learn, or simply join as a client; this is the trust model of the
  MACs (whoever has the secret can already sign any message). Nothing is added against a holder
  of the secret; against everyone else the traffic is now confidential as well as authentic.
- No ZAP handler checks client keys: a client is admitted by completing the handshake, which
  needs the server's long-term public key. That key is derived from the secret and never sent
  in clear (CurveZMQ's HELLO is boxed to it, the server's reply to the client's short-term key),
  so a client without the secret cannot complete it; a socket without CURVE at all is refused
  at the mechanism check. Its messages are never delivered to the application.
- One secret per `serve` run (new at each start): a restart changes every key.

Whether to encrypt (`--kv-encryption`): `on`, `off`, or `auto` = on unless every worker binds a
loopback address (127.0.0.0/8, ::1, "localhost"), where the traffic never leaves the host and
encryption would only cost throughput. 0.0.0.0, ::, * and any other name count as not loopback
(no DNS lookup decides to send in the clear). With Ray on a cluster given by --ray-address the
workers may be on other hosts, so auto is on there too.

CURVE adds 33 bytes to every frame on the wire (flags, the MESSAGE command name, a nonce, the
Poly1305 tag), and ZMQ_MAXMSGSIZE applies to the wire frame: `server`/`client` raise a socket's
limit by that much, so protocol.limit_socket's bounds still hold for the plaintext.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass

import zmq
from zmq.utils import z85

from ..errors import UserError

SETTINGS = ("auto", "on", "off")
CURVE_FRAME_OVERHEAD = 33  # wire bytes CURVE adds to each frame (measured: tests/serve/test_curve.py)


def is_loopback(host: str) -> bool:
    """True when `host` (an address to bind on) is a loopback address: 127.0.0.0/8, ::1 (IPv4
    mapped or not, with or without brackets), or the name localhost (RFC 6761: it and its
    subdomains are loopback). Wildcards (0.0.0.0, ::, *) and other names are not."""
    h = host.strip().strip("[]").lower().rstrip(".")
    if h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        return False  # an interface or host name: not trusted to stay on this host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def encryption_on(setting: str, host: str, remote_workers: bool = False) -> bool:
    """Whether the cluster's internal sockets use CURVE: `setting` is on, off or auto (on unless
    `host`, where the sockets bind, is loopback and no worker may run on another host)."""
    if setting not in SETTINGS:
        raise UserError(f"--kv-encryption must be auto, on or off, got {setting!r}")
    if setting == "auto":
        return remote_workers or not is_loopback(host)
    return setting == "on"


def require_curve(has=zmq.has) -> None:
    """UserError unless this libzmq was built with CURVE (`has`: zmq.has, or a stand-in)."""
    if not has("curve"):
        raise UserError(f"--kv-encryption: this libzmq ({zmq.zmq_version()}) was built without CURVE "
                        f"(zmq.has('curve') is False); install a pyzmq wheel (it bundles libzmq with "
                        f"libsodium) or use --kv-encryption off")


@dataclass(frozen=True, slots=True)
class CurveKeys:
    """The cluster's CURVE key pair, z85-encoded (40 bytes each)."""

    public: bytes
    secret: bytes

    @classmethod
    def from_secret(cls, cluster_secret: bytes) -> CurveKeys:
        """The key pair of the cluster whose secret is `cluster_secret` (see the module docstring)."""
        require_curve()
        if len(cluster_secret) < 16:
            raise ValueError("the cluster secret must be at least 16 bytes")
        raw = hashlib.blake2b(key=cluster_secret[:64], digest_size=32, person=b"splitserve-curve").digest()
        secret = z85.encode(raw)
        return cls(public=zmq.curve_public(secret), secret=secret)

    def server(self, sock: zmq.Socket) -> None:
        """Make `sock` a CURVE server. Call it after limit_socket and before bind."""
        _room_for_overhead(sock)
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True

    def client(self, sock: zmq.Socket) -> None:
        """Make `sock` a CURVE client of the cluster's servers. After limit_socket, before connect."""
        _room_for_overhead(sock)
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_serverkey = self.public


def _room_for_overhead(sock: zmq.Socket) -> None:
    limit = sock.getsockopt(zmq.MAXMSGSIZE)
    assert isinstance(limit, int)  # an int64 option (pyzmq types every option's value as int | bytes)
    if limit >= 0:  # -1: no limit
        sock.setsockopt(zmq.MAXMSGSIZE, limit + CURVE_FRAME_OVERHEAD)
