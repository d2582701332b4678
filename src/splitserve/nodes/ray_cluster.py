"""Joining a Ray cluster for `provision --backend ray` and `serve --backend ray`: Ray's own reason
when it cannot, and the same splitserve on every node.

`connect(address)` starts a new local Ray instance (no address, or "local") or joins the cluster at
HOST:PORT. Joining first opens a TCP connection to HOST:PORT (5 s), so that a wrong address is
one line at once instead of Ray's minutes of retries; then `ray.init`. When that fails, the line
carries Ray's own message: `ray.init` wraps the GCS client's error (Ray's AuthenticationError when
the cluster requires a token this host lacks: "RPC error: InvalidAuthToken: Authentication token is
missing or incorrect ..."; a time-out; Ray's version mismatch) in a ConnectionError whose cause
ends with it. While joining, what Ray writes on stderr (a warning a second while it retries) is
held back, and shown only if the join succeeds (its INFO lines are left out). `ray.init` replaces the process's SIGTERM handler
(Ray's calls sys.exit inside whatever runs, and its C++ handler aborts); `connect` puts back the
one that was there.

`check_nodes()` runs a task on every live node that reports the splitserve there: its version and
the fingerprint of its source (nodes/fingerprint.py `code_fingerprint`, provisioning's cache key). A node
that differs from this host, or cannot import splitserve, is one `error:` line that names it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
import threading

from .. import __version__
from ..errors import UserError
from .fingerprint import code_fingerprint

PROBE_TIMEOUT_S = 5.0     # a TCP connection to the cluster's address, before ray.init
CHECK_TIMEOUT_S = 120.0   # every node's answer to the version check (a node may start a worker first)


def import_ray():
    try:
        import ray
    except ImportError:
        raise UserError("--backend ray needs Ray: pip install 'splitserve[ray]'") from None
    return ray


def is_local(address: str | None) -> bool:
    """No address (or "local"): a new Ray instance on this host."""
    return address in (None, "", "local")


def host_port(address: str) -> tuple[str, int]:
    """HOST:PORT of a cluster address (`ray://HOST:PORT`, Ray Client's, too)."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(f"Ray cluster address {address!r}: give HOST:PORT (the head node's GCS port, "
                        f"6379 unless `ray start --head --port` said otherwise)")
    return host.strip("[]"), int(port)


def probe(address: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Something accepts TCP connections at the address, or one error line saying what the OS said."""
    host, port = host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except socket.timeout:
        raise UserError(f"cannot reach the Ray cluster at {address}: no answer from {host}:{port} within "
                        f"{timeout:g} s (a firewall, or a wrong host?)") from None
    except OSError as e:
        raise UserError(f"cannot reach the Ray cluster at {address}: {host}:{port}: {e.strerror or e} "
                        f"(is `ray start --head` running there, on that port?)") from None


def ray_reason(exc: BaseException) -> str:
    """Ray's own message for a failed ray.init, on one line: the last line of the wrapped cause (the
    GCS client's traceback ends with Ray's exception and its message), else the exception's own."""
    text = str(exc)
    if exc.__cause__ is not None:
        lines = [ln for ln in str(exc.__cause__).splitlines() if ln.strip()]
        if lines:
            text = lines[-1]
    return " ".join(text.split())


def local_ip(address: str | None) -> str:
    """This host's IP as the cluster at `address` sees it (the interface that routes there): where
    a router that remote workers connect to must bind. 127.0.0.1 for a local instance."""
    if address is None or is_local(address):
        return "127.0.0.1"
    ray = import_ray()
    host, port = host_port(address)
    return ray.util.get_node_ip_address(f"{host}:{port}")


@contextlib.contextmanager
def _stderr_held():
    """File descriptor 2 (Python's and Ray's C++ logging) into a temporary file; yields a function
    that returns what was written there."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield lambda: (held.seek(0), held.read().decode(errors="replace"))[1]
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def connect(address: str | None, *, num_cpus: int | None = None, runtime_env: dict | None = None,
            log_to_driver: bool = False) -> bool:
    """Start or join Ray; True when this call did (its caller shuts Ray down), False when this
    process was already connected."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    kw = dict(include_dashboard=False, log_to_driver=log_to_driver, runtime_env=runtime_env,
              logging_level=logging.WARNING)   # not Ray's "Connecting ..." INFO lines
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        if address is None or is_local(address):
            ray.init(address="local", num_cpus=num_cpus, **kw)
        else:
            probe(address)
            with _stderr_held() as said:
                try:
                    ray.init(address=address, **kw)
                    ok = True
                except (OSError, RuntimeError, ray.exceptions.RayError) as e:  # ConnectionError, AuthenticationError...
                    ok, reason = False, ray_reason(e)
                printed = said()
            if not ok:
                raise UserError(f"cannot join the Ray cluster at {address}: {reason}")
            sys.stderr.write(printed)
    finally:
        if main:
            signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)
    return True


def node_name(node: dict) -> str:
    return f"{node['NodeID'][:12]} ({node['NodeManagerAddress']})"


def check_nodes(timeout: float = CHECK_TIMEOUT_S) -> list[dict]:
    """Every live node's splitserve equals this host's (version and source), or one error line that
    names the first node that differs. Returns the live nodes (ray.nodes() entries)."""
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ours = (__version__, code_fingerprint())
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    def installed():
        """On a node: (its splitserve's version, source fingerprint), or why it cannot import it.
        Defined here, so that Ray sends it by value: a node with another splitserve (or none) still
        runs it and says which."""
        try:
            import splitserve
        except ImportError as e:
            return f"{type(e).__name__}: {e}"
        try:
            from splitserve.nodes.fingerprint import code_fingerprint
            return (splitserve.__version__, code_fingerprint())
        except (ImportError, OSError) as e:  # another splitserve: its version is still worth naming
            return (getattr(splitserve, "__version__", "unknown"), f"unknown ({type(e).__name__})")

    probe_task = ray.remote(num_cpus=0, max_retries=0)(installed)
    refs = {probe_task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(): n for n in nodes}
    done, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    if late:
        raise UserError(f"Ray node {node_name(refs[late[0]])} did not answer the splitserve version check "
                        f"within {timeout:g} s")
    for ref in done:
        node = refs[ref]
        try:
            theirs = ray.get(ref)
        except ray.exceptions.RayError as e:   # the task failed there, or its worker or node died
            raise UserError(f"Ray node {node_name(node)} cannot run splitserve: "
                            f"{' '.join(str(e).split())[-300:]}") from None
        if isinstance(theirs, str):
            raise UserError(f"Ray node {node_name(node)} cannot import splitserve ({theirs}): install "
                            f"splitserve {ours[0]} there")
        if theirs[0] != ours[0]:
            raise UserError(f"Ray node {node_name(node)} has splitserve {theirs[0]}, this host has {ours[0]}: "
                            f"install the same version on every node")
        if theirs[1] != ours[1]:
            raise UserError(f"Ray node {node_name(node)} has splitserve {theirs[0]} with other source files "
                            f"(fingerprint {theirs[1]}, this host's {ours[1]}): install the same splitserve "
                            f"on every node")
    return nodes

