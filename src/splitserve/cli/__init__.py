"""The `splitserve` command. One module per command, all in one pattern: each holds a typer app
(`app`) with its one command (or, for `reproduce` and `tokenizer`, a named group of them), whose
function parses the options into a typed request and hands it to the package that does the work.
Here they are put together, each given `--log-level` (log_level.py), and `main` turns a user's
mistake into one `error:` line."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Annotated, Any

import typer

from ..errors import UserError
from .log_level import with_log_level

# the command modules, each named as its command (or, reproduce and tokenizer, its group): imported
# only when asked for, so that `splitserve simulate` does not load the serving stack
NAMES = ("simulate", "provision", "generate", "bench", "compare", "serve", "profile", "twin", "reproduce", "tokenizer")
_WRAPPED: set[str] = set()


def command_module(name: str) -> ModuleType:
    """The command module `name`, its commands given `--log-level` (once)."""
    module = importlib.import_module(f"{__name__}.{name}")
    if name not in _WRAPPED:
        _WRAPPED.add(name)
        for info in module.app.registered_commands:
            info.callback = with_log_level(info.callback)
    return module


def build_app(only: str | None = None) -> typer.Typer:
    """The `splitserve` app with every command, or with command `only` alone (what `main` runs)."""
    app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                      context_settings={"help_option_names": ["-h", "--help"]},
                      help="Phase-split (Splitwise) LLM serving: simulate, provision and serve clusters.")
    for name in NAMES if only is None else (only,):
        app.add_typer(command_module(name).app)
    app.callback()(_root)
    return app


def __getattr__(name: str) -> Any:
    """`app` (every command) and `COMMANDS` (their modules), built when first asked for."""
    if name == "app":
        globals()["app"] = built = build_app()
        return built
    if name == "COMMANDS":
        return tuple(command_module(n) for n in NAMES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _command_named(argv: list[str]) -> str | None:
    """The command `argv` runs when it is one of NAMES (the first word not an option), else None."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in NAMES else None
    return None


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version as installed_version   # 12 ms: --version alone needs it

        from ..sim import compiled
        hot = "compiled with mypyc" if compiled() else "pure Python"
        typer.echo(f"splitserve {installed_version('splitserve')} (simulator hot path: {hot})")
        raise typer.Exit(0)


def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the package version and exit.")] = False,
) -> None:
    """Phase-split (Splitwise) LLM serving: simulate, provision and serve clusters."""


def main(argv: list[str] | None = None) -> int:
    """Entry point: user mistakes become one `error:` line and exit status 2, never a traceback."""
    args = sys.argv[1:] if argv is None else argv
    only = _command_named(args)
    app = build_app(only) if only is not None else __getattr__("app")
    try:
        result = app(args=argv, standalone_mode=False)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except typer.Exit as e:
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        print("error: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        if e.filename is None:   # not a path the user gave (a socket, a library): a bug, keep the traceback
            raise
        print(f"error: {e.strerror or e}: {e.filename}", file=sys.stderr)
        return 2
    except Exception as e:
        # usage errors of the command-line parser (typer bundles its own click): bad option,
        # bad value, missing argument. They carry their own message and exit code.
        fmt = getattr(e, "format_message", None)
        if not callable(fmt) or not hasattr(e, "exit_code"):
            raise
        if e.exit_code == 0:
            return 0
        print(f"error: {fmt()}", file=sys.stderr)
        return 2
    return result if isinstance(result, int) else 0
