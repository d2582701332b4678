"""Logging's one configuration, set up by the processes splitserve starts and never on import.

The library only logs (`logger = logging.getLogger(__name__)` per module). Whoever owns a process
calls `configure`: the `splitserve` command (`--log-level`, cli/log_level.py), and each process it
starts (serve's workers and tensor-parallel ranks), which reads the level from SPLITSERVE_LOG_LEVEL:
`configure` sets it, and child processes inherit the environment. Records go to stderr as
`time level logger: message`; uvicorn's loggers are joined to the same handler (the server runs
uvicorn with `log_config=None`; a handler of their own, from uvicorn's default configuration in
the same process, is dropped) and keep their own levels. httpx and httpcore log one record per HTTP
request at INFO (bench sends thousands): they show at DEBUG only. The default is INFO, as vLLM's
and uvicorn's.
"""

from __future__ import annotations

import logging
import os
import sys

from .errors import UserError

ENV = "SPLITSERVE_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT = "INFO"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
logger = logging.getLogger(__name__)

UVICORN = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")
PER_REQUEST = ("httpx", "httpcore")


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is when a record is emitted (a test's capture, a redirect made
    after configuration), not the stream that was current when it was made."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self):  # type: ignore[no-untyped-def,override]
        return sys.stderr


def level_name(level: str | None) -> str:
    """`level`, else SPLITSERVE_LOG_LEVEL, else INFO; upper-cased and checked."""
    name = (level or os.environ.get(ENV) or DEFAULT).upper()
    if name not in LEVELS:
        raise UserError(f"log level {name!r}: give one of {', '.join(LEVELS)}")
    return name


def configure(level: str | None = None) -> str:
    """Route every logger through one stderr handler at `level` (level_name) and export the level
    to the processes this one starts. Idempotent: a second call replaces this module's handler and
    leaves any other (a test runner's capture) in place. Returns the level's name."""
    name = level_name(level)
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h, StderrHandler)]:
        root.removeHandler(h)
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(handler)
    root.setLevel(name)
    for logger_name in UVICORN:           # uvicorn's, joined: no handler of their own
        joined = logging.getLogger(logger_name)
        joined.handlers.clear()
        joined.propagate = True
    for logger_name in PER_REQUEST:
        logging.getLogger(logger_name).setLevel(logging.NOTSET if name == "DEBUG" else logging.WARNING)
    os.environ[ENV] = name
    logger.debug("logging at %s to stderr (pid %d)", name, os.getpid())
    return name
