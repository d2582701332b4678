"""The quick start's first command installs splitserve without its extras (`pip install .`) and runs
`splitserve simulate`: the command line must start, and simulate, provision and every --help must
run, with none of the extras' packages importable (torch, tokenizers, the serving stack, Ray)."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
# pydantic is not among them: typer needs it
EXTRAS = ("torch", "tokenizers", "safetensors", "fastapi", "starlette", "uvicorn", "httpx",
          "zmq", "msgpack", "prometheus_client", "jinja2", "orjson", "ray", "transformers")

RUN = f"""
import sys
sys.path.insert(0, {str(SRC)!r})
for name in {EXTRAS!r}:
    sys.modules[name] = None   # `import name` fails as if not installed; find_spec(name) is None
from splitserve.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN, *argv], capture_output=True, text=True, timeout=300)


def test_simulate_runs_without_the_extras(tmp_path):
    p = run("simulate", "-q", "--duration", "20", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "summary.json").exists()


def test_every_help_renders_without_the_extras():
    cmds = ("simulate", "provision", "compare", "serve", "bench", "generate", "profile", "twin", "reproduce",
            "tokenizer")
    with ThreadPoolExecutor(len(cmds)) as pool:   # independent processes, at once (CI has two cores)
        done = list(pool.map(lambda cmd: run(cmd, "--help"), cmds))
    for cmd, p in zip(cmds, done):
        assert p.returncode == 0, f"{cmd} --help: {p.stderr[-2000:]}"


def test_serve_without_its_extra_says_what_to_install():
    p = run("serve", "--model", "tiny")
    assert p.returncode != 0
    assert "serve extra" in p.stderr and "Traceback" not in p.stderr
