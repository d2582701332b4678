"""Run configs: a command's options from a TOML or YAML file (`--config FILE`), and back.

A config file is a table of the command's long option names, with dashes or underscores
(`prompt-machines = 4`, `prompt_machines: 4`), and values as the command line takes them
(`no-cache = true` for a switch, a list for a repeatable option). The file fills the options the
command line leaves out: click's `default_map`, set by the eager `--config` option before the
other options are parsed, so a value typed on the command line wins and every value goes through
the option's own type conversion and checks. A key that is no option of the command is a
UserError naming it and its close matches.

`effective_config` is the other way: every option the run used, by long name, as a JSON object
that a run's output keeps (summary.json `config`, provision.json `config`). A JSON file whose top
level has a `config` object (a run's own summary.json) is read as that object, so a run can be
repeated from its output: `splitserve simulate --config out/summary.json`.
"""

from __future__ import annotations

import difflib
import json
import tomllib
from pathlib import Path
from typing import Any

import typer

from ..errors import UserError

__all__ = ["CONFIG_HELP", "apply_config", "config_option", "effective_config", "option_keys", "read_config",
           "record_run"]

CONFIG_HELP = ("A run config, TOML or YAML (or a run's summary.json, provision.json, results.json): the long option "
               "names (dashes or underscores) and their values; options given on the command line win.")
SKIP = frozenset({"config", "help", "log_level"})   # options a config file cannot set, nor a run records


def config_option():
    """The `--config FILE` option (eager: its values are the command's defaults)."""
    return typer.Option(is_eager=True, callback=apply_config, help=CONFIG_HELP)


def read_config(path: str | Path) -> dict[str, Any]:
    """The table of a config file, by its suffix: .toml, .yaml/.yml, .json (its `config` object
    when it has one)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--config {p}: cannot read it: {getattr(e, 'strerror', None) or e}") from None
    suffix = p.suffix.lower()
    data = parse(text, suffix, p)
    if not isinstance(data, dict):
        raise UserError(f"--config {p}: the file must hold a table of options, got {type(data).__name__}")
    return data


def parse(text: str, suffix: str, p: Path) -> Any:
    """The text parsed by its suffix's parser (a JSON run summary: its `config` object); a syntax
    error, the parser's own exception, is a UserError with its first line."""
    errors: tuple[type[Exception], ...]
    if suffix == ".toml":
        loads, errors = tomllib.loads, (tomllib.TOMLDecodeError,)
    elif suffix in (".yaml", ".yml"):
        import yaml

        loads, errors = yaml.safe_load, (yaml.YAMLError, ValueError)
    elif suffix == ".json":
        loads, errors = json.loads, (ValueError, RecursionError)
    else:
        raise UserError(f"--config {p}: give a .toml, .yaml, .yml or .json file")
    try:
        data = loads(text)
    except errors as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"--config {p}: not valid {suffix[1:].upper()}: {first}") from None
    if suffix == ".json" and isinstance(data, dict) and isinstance(data.get("config"), dict):
        return data["config"]
    return {} if data is None and suffix != ".json" else data


def _options(command: Any) -> list[Any]:
    """The command's options (typer's click parameters of kind "option"), --config and --help left out."""
    return [p for p in command.params if p.param_type_name == "option" and p.name not in SKIP]


def option_keys(command: Any) -> dict[str, Any]:
    """Every key a config file may use for `command`, to its option: each long option name
    without its dashes, written with dashes and with underscores."""
    keys: dict[str, Any] = {}
    for param in _options(command):
        for opt in param.opts:
            if opt.startswith("--"):
                name = opt[2:]
                keys[name] = keys[name.replace("-", "_")] = param
    return keys


def _primary(param: Any) -> str:
    return next(o[2:] for o in param.opts if o.startswith("--"))


def apply_config(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """The `--config` option's callback (eager: it runs before the other options are parsed):
    the file's values become the command's `default_map`."""
    if value is None or ctx.resilient_parsing:
        return value
    data = read_config(value)
    keys = option_keys(ctx.command)
    unknown = [k for k in data if k not in keys]
    if unknown:
        names = sorted({_primary(o) for o in keys.values()})
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k.replace("_", "-"), names, n=3)
            hints.append(f"{k!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        raise UserError(f"--config {value}: unknown option{'s' if len(unknown) > 1 else ''} "
                        f"{', '.join(hints)}; `splitserve {ctx.info_name} --help` lists them")
    defaults: dict[str, Any] = {}
    for k, v in data.items():
        opt = keys[k]
        if opt.name in defaults:
            raise UserError(f"--config {value}: {_primary(opt)} is given twice")
        if opt.multiple and not isinstance(v, list):
            v = [v]
        defaults[opt.name] = v
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def effective_config(ctx: typer.Context) -> dict[str, Any]:
    """The options a run used, by long name (as a config file takes them): every option of the
    command but --config and --help, in the command's order; options left unset (None) left out."""
    out: dict[str, Any] = {}
    for param in _options(ctx.command):
        v = ctx.params.get(param.name)
        if v is None or (isinstance(v, (tuple, list)) and not v):
            continue
        if isinstance(v, Path):
            v = str(v)
        elif isinstance(v, (tuple, list)):
            v = [str(x) if isinstance(x, Path) else x for x in v]
        out[_primary(param)] = v
    return out


def record_run(result: dict, ctx: typer.Context, cat) -> None:
    """What an output records of its run: the command's options by long name (`config`, what
    --config reads back) and the user catalog used, if any (`catalog`)."""
    result["config"] = effective_config(ctx)
    if cat is not None:
        result["catalog"] = cat.note()
