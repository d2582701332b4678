"""Logging (logs.py, cli/log_level.py): every command takes --log-level; records reach stderr as
`time level logger: message` at that level and above, uvicorn's included; the level is exported to
the processes a command starts."""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path

import pytest
import typer

from splitserve import logs
from splitserve.cli import app, main

RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")
SIM = ["simulate", "--duration", "1", "--rps", "2"]


@pytest.fixture(autouse=True)
def restored_logging(monkeypatch):
    """The root logger and SPLITSERVE_LOG_LEVEL as they were before the test."""
    monkeypatch.delenv(logs.ENV, raising=False)
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def records(err: str) -> list[str]:
    return [line for line in err.splitlines() if RECORD.match(line)]


def test_debug_shows_a_library_record_and_error_hides_it(capsys):
    assert main([*SIM, "--log-level", "DEBUG"]) == 0
    shown = records(capsys.readouterr().err)
    assert any(" DEBUG splitserve.logs: logging at DEBUG" in line for line in shown), shown
    assert main([*SIM, "--log-level", "ERROR"]) == 0
    assert records(capsys.readouterr().err) == []


def test_the_level_is_exported_to_child_processes_and_read_from_the_environment(capsys, monkeypatch):
    import os

    assert main([*SIM, "--log-level", "warning"]) == 0
    assert os.environ[logs.ENV] == "WARNING"             # what serve's workers read (logs.configure)
    assert logging.getLogger().level == logging.WARNING
    monkeypatch.setenv(logs.ENV, "DEBUG")                 # no flag: the environment's level
    assert main(SIM) == 0
    assert logging.getLogger().level == logging.DEBUG


def test_uvicorn_records_go_through_the_one_handler_and_httpx_shows_at_debug_only(capsys):
    import logging.config

    from uvicorn.config import LOGGING_CONFIG

    logging.config.dictConfig(LOGGING_CONFIG)    # uvicorn's own handlers, as a server in this process left them
    logs.configure("INFO")
    logging.getLogger("uvicorn.error").info("started")
    logging.getLogger("uvicorn.access").info("GET /")
    logging.getLogger("httpx").info("HTTP Request: GET /")
    logging.getLogger("splitserve.sim").debug("below the level")
    assert [line.split(" ", 2)[2] for line in records(capsys.readouterr().err)] == [
        "INFO uvicorn.error: started", "INFO uvicorn.access: GET /"]
    logs.configure("DEBUG")
    logging.getLogger("httpx").info("HTTP Request: GET /")
    assert [line.split(" ", 2)[2] for line in records(capsys.readouterr().err)][-1] == "INFO httpx: HTTP Request: GET /"


def test_configuring_twice_keeps_one_handler_and_a_bad_level_is_a_user_error():
    logs.configure("INFO")
    logs.configure("DEBUG")
    assert sum(isinstance(h, logs.StderrHandler) for h in logging.getLogger().handlers) == 1
    with pytest.raises(Exception, match="log level 'LOUD'"):
        logs.level_name("loud")


def test_every_command_has_the_option():
    def leaves(cmd, path=()):
        subs = getattr(cmd, "commands", None)
        if subs is None:
            yield " ".join(path), cmd
        else:
            for name, sub in subs.items():
                yield from leaves(sub, (*path, name))

    found = {path: any("--log-level" in p.opts for p in cmd.params)
             for path, cmd in leaves(typer.main.get_command(app))}
    assert len(found) >= 14 and all(found.values()), found


def prints(source: str) -> list[int]:
    """Lines of `source` that call the builtin print (a `console.print` or a print inside a string
    of child-process code is not one)."""
    return [n.lineno for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"]


def test_the_library_logs_and_only_the_cli_prints():
    assert prints("print('x')\nconsole.print('y')\nCHILD = 'print(1)'\nif x:\n    print(2, file=e)\n") == [1, 5]
    pkg = Path(logs.__file__).parent
    found = {str(p.relative_to(pkg)): prints(p.read_text()) for p in sorted(pkg.rglob("*.py"))
             if p.relative_to(pkg).parts[0] != "cli"}
    assert {k: v for k, v in found.items() if v} == {}, "use logging.getLogger(__name__) below the CLI"


def test_ray_worker_actors_get_the_level(monkeypatch):
    from splitserve.serve.launcher import ray_env
    from splitserve.serve.protocol import SECRET_ENV

    assert ray_env(b"\x01\x02") == {"env_vars": {SECRET_ENV: "0102"}}
    logs.configure("debug")
    assert ray_env(b"\x01") == {"env_vars": {SECRET_ENV: "01", logs.ENV: "DEBUG"}}
