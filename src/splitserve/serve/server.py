"""Running the server: uvicorn, with a drain on shutdown (no request in flight is cut without an
answer). Imported by the `serve` command once the serve extra is known to be installed."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import signal
import socket
import time
from typing import Any

import uvicorn

from ..errors import UserError
from ..heap import freeze_heap

logger = logging.getLogger(__name__)


def run_server(cfg, sock: socket.socket, http: str = "auto", loop: str = "auto") -> None:
    """Run the server under uvicorn on `sock` (bound by `ServeConfig.listen` before any worker
    started). `auto` takes httptools and uvloop when they are installed (the serve extra installs
    both), else h11 and asyncio."""
    from .api import create_app

    if http not in ("auto", "h11", "httptools") or loop not in ("auto", "asyncio", "uvloop"):
        raise UserError("--http-impl is auto, h11 or httptools; --loop-impl is auto, asyncio or uvloop")
    if cfg.worker_mode == "echo":
        logger.warning("WORKER MODE echo: a benchmark tool; workers return tokens WITHOUT computing them")
    app = create_app(cfg)
    protocol: Any = http
    if http in ("auto", "httptools") and importlib.util.find_spec("httptools") is not None:
        from .shed import shedding_protocol   # a full server's 429 from the protocol itself
        protocol = shedding_protocol(app.state.refusal)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_config=None, access_log=False,
                            lifespan="on", timeout_graceful_shutdown=5, http=protocol, loop=loop)
    server = DrainingServer(config, app.state.router, cfg.drain_timeout_s)
    server.run(sockets=[sock])
    if not server.started:
        raise UserError("the server did not start (see the messages above)")
    if server.interrupted:
        # uvicorn re-raises the SIGINT it caught under the handler from before; a process started
        # with SIGINT ignored (`nohup cmd &`, a non-interactive shell's background job) would
        # then exit 0. Ctrl-C ends with 130 however the server was started.
        raise KeyboardInterrupt


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with a drain before its shutdown: on SIGTERM/SIGINT the listening
    sockets close (new connections are refused) and new requests on open connections get 503;
    requests in flight have `drain_s` seconds to finish; then each that remains is ended with an
    error (streams: an error event, then [DONE]), before uvicorn waits for connections to close
    and the router stops the workers."""

    def __init__(self, config, router, drain_s: float) -> None:
        super().__init__(config)
        self.router, self.drain_s = router, drain_s
        self.interrupted = False

    def handle_exit(self, sig, frame) -> None:
        self.interrupted = self.interrupted or sig == signal.SIGINT
        super().handle_exit(sig, frame)

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started:
            freeze_heap()  # the app's, the router's and the imports' objects out of the collector's full passes (heap.py)
            for s in self.servers:
                for sock in s.sockets:
                    h, p = sock.getsockname()[:2]
                    logger.info("listening on http://%s:%s (model %s, design %s); try: curl "
                                "http://%s:%s/v1/models", h, p, self.router.cfg.model, self.router.cfg.design, h, p)

    async def shutdown(self, sockets=None):
        for s in self.servers:
            s.close()  # no new connections
        self.router.drain()
        if self.router.active:
            logger.info("draining %d requests in flight (up to %g s)", len(self.router.active), self.drain_s)
        deadline = time.monotonic() + self.drain_s
        while self.router.active and time.monotonic() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)
        if self.router.active:
            logger.info("ending %d unfinished requests", len(self.router.active))
            self.router.fail_all("the server is shutting down")
            await asyncio.sleep(0.2)  # let their last events go out
        await super().shutdown(sockets)
