"""`--log-level`, shared by every command: cli/__init__.py wraps each command's function with
`with_log_level`, which adds the option and configures logging (logs.py) before the command runs."""

from __future__ import annotations

import enum
import functools
import inspect
import typing
from typing import Annotated, Any, Callable, Optional

import typer

from .. import logs


class LogLevel(enum.StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


OPTION = typer.Option("--log-level", envvar=logs.ENV, case_sensitive=False, show_default=False,
                      help=f"Log records at this level and above, to stderr (default {logs.DEFAULT}, as vLLM's; "
                           "serve's workers log at the same level).")
PARAM = inspect.Parameter("log_level", inspect.Parameter.KEYWORD_ONLY,
                          annotation=Annotated[Optional[LogLevel], OPTION], default=None)


def with_log_level(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command` with a `--log-level` option: logging is configured from it, then `command` runs
    with its own options."""
    hints = typing.get_type_hints(command, include_extras=True)   # resolved where the command lives
    sig = inspect.signature(command)
    params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()]

    @functools.wraps(command)
    def wrapper(**kw: Any) -> Any:
        level = kw.pop("log_level")
        logs.configure(level.value if level is not None else None)
        return command(**kw)

    wrapper.__signature__ = sig.replace(parameters=[*params, PARAM])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in [*params, PARAM]}
    return wrapper
