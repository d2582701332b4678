"""`splitserve simulate` imports its own command only (cli/__init__.py, issue 44): not the serving
stack, torch, or the other commands, whose imports would be every simulation's start-up."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "fastapi", "uvicorn", "matplotlib", "splitserve.serve", "splitserve.cli.serve",
         "splitserve.cli.provision", "splitserve.cli.bench", "splitserve.reproduce", "splitserve.compare")

CODE = f"""
import contextlib, io, sys
from splitserve.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    main(["simulate", "--help"])
print(sorted(m for m in {HEAVY!r} if m in sys.modules))
"""


def test_simulate_imports_its_own_command_only():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_the_whole_app_still_has_every_command():
    from splitserve.cli import NAMES, app
    import typer

    names = set(typer.main.get_command(app).commands)
    assert {"simulate", "provision", "serve", "reproduce", "tokenizer"} <= names and len(NAMES) == 10
