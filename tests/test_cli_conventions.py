"""Command-line conventions (issue 17, item 5): a trace replays at its own timestamps when no rate
is given, `--help` shows every effective default, `-h` is `--help`, `--version` prints the
package version."""

from __future__ import annotations

import json
from importlib.metadata import version

import pytest
import typer.main

from splitserve.cli import app, main
from splitserve.sim.run import arrival_defaults


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def trace_60(tmp_path):
    """60 requests 0.5 s apart: a 2 req/s trace spanning 29.5 s."""
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [f"{i * 0.5},{100 + i},{10 + i % 7}" for i in range(60)]
    p = tmp_path / "t60.csv"
    p.write_text("\n".join(rows) + "\n")
    return str(p)


def simulate(capsys, *args):
    code, out, err = run(capsys, "simulate", "--json", "-q", "-p", "1", "-t", "1", *args)
    assert code == 0, err
    return json.loads(out)


def test_a_trace_without_rps_replays_at_its_own_timestamps(capsys, tmp_path):
    s = simulate(capsys, "--workload", trace_60(tmp_path))
    assert s["requests"] == 60                             # was 1,200: 10 req/s over 120 s
    assert s["workload"]["rps"] == pytest.approx(59 / 29.5)  # 2.0 req/s, the trace's own
    assert s["workload"]["duration_s"] == pytest.approx(29.5)


def test_duration_without_rps_clips_the_replay(capsys, tmp_path):
    # arrivals at 0, 0.5, ..., 9.5 s fall before 10 s: 20 requests
    s = simulate(capsys, "--workload", trace_60(tmp_path), "--duration", "10")
    assert s["requests"] == 20 and s["workload"]["rps"] == pytest.approx(2.0)


def test_a_trace_with_rps_is_rescaled_as_before(capsys, tmp_path):
    # 4 req/s: the trace runs twice as fast (29.5 s -> 14.75 s, copies 15 s apart) for the
    # default 120 s: 8 copies of 60 requests
    s = simulate(capsys, "--workload", trace_60(tmp_path), "--rps", "4")
    assert s["requests"] == 480 and s["workload"]["duration_s"] == 120.0


def test_a_synthetic_workload_keeps_its_defaults():
    assert arrival_defaults("coding", None, None, None) == (10.0, 120.0)
    assert arrival_defaults("coding", 3.0, None, None) == (3.0, 120.0)
    assert arrival_defaults("trace.csv", None, None, None) == (None, None)
    assert arrival_defaults("trace.csv", None, 30.0, None) == (None, 30.0)
    assert arrival_defaults("trace.csv", 5.0, None, None) == (5.0, 120.0)
    assert arrival_defaults("trace.csv", None, None, "0:5") == (None, 120.0)


def _options(*path):
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return {p.opts[0]: p for p in cmd.params if getattr(p, "param_type_name", "") == "option"}


def test_simulate_help_states_the_effective_defaults(capsys):
    opts = _options("simulate")
    assert "default 4 " in opts["--prompt-machines"].help
    assert "default 1 " in opts["--token-machines"].help
    assert "default 5 " in opts["--machines"].help
    assert "default 10 " in opts["--rps"].help
    assert "default 120;" in opts["--duration"].help
    code, out, _ = run(capsys, "simulate", "--help")
    flat = " ".join(out.replace("│", " ").split())
    assert code == 0 and "(default 10 for a synthetic workload;" in flat


def test_every_option_with_a_numeric_default_shows_it():
    """Options of simulate, provision, serve and generate whose value is a number: a default of
    None must be explained in the help ("default ..."), any other is shown by typer."""
    for command in ("simulate", "provision", "serve", "generate"):
        for name, p in _options(command).items():
            if p.hidden or p.is_flag or p.type_descriptor.annotation not in (int, float):
                continue
            if p.default is None:
                assert "default" in (p.help or "").lower(), (command, name)
            else:
                assert p.show_default is not False, (command, name)


@pytest.mark.parametrize("path", [[], ["simulate"], ["provision"], ["serve"], ["bench"], ["reproduce"],
                                  ["reproduce", "splitwise"]])
def test_dash_h_is_help(capsys, path):
    code_long, long, _ = run(capsys, *path, "--help")
    code_short, short, _ = run(capsys, *path, "-h")
    assert code_long == code_short == 0
    assert short == long and "Usage:" in short


def test_version(capsys):
    code, out, err = run(capsys, "--version")
    assert code == 0 and err == ""
    from splitserve.sim import simulator
    hot = "pure Python" if simulator.__file__.endswith(".py") else "compiled with mypyc"
    assert out == f"splitserve {version('splitserve')} (simulator hot path: {hot})\n"
