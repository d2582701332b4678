"""Run configs (`--config FILE`, cli/config_file.py): a TOML or YAML file of long option names gives the
run the same options typed on the command line would; the command line wins; the run's output
keeps its effective config, from which the run repeats."""

import json

import pytest

from splitserve.cli import main
from splitserve.cli.config_file import read_config

ARGS = ["--design", "baseline-h100", "--machines", "2", "--rps", "3", "--duration", "20", "--seed", "7",
        "--machine-scheduler", "sarathi", "--chunk-size", "256"]
TOML = """design = "baseline-h100"
machines = 2
rps = 3
duration = 20
seed = 7
machine-scheduler = "sarathi"
chunk_size = 256
"""
YAML = """# the same, in YAML, with underscores
design: baseline-h100
machines: 2
rps: 3
duration: 20
seed: 7
machine_scheduler: sarathi
chunk_size: 256
"""
TIMING = ("wall_s", "events_per_s")   # the only fields of summary.json that differ between two runs


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def summary(capsys, *args) -> dict:
    code, out, err = run(capsys, "simulate", "--json", "--quiet", *args)
    assert code == 0, err
    s = json.loads(out)
    for k in TIMING:
        s["sim"].pop(k)
    return s


def test_a_config_file_gives_the_summary_of_the_same_options(tmp_path, capsys):
    (tmp_path / "run.toml").write_text(TOML)
    (tmp_path / "run.yaml").write_text(YAML)
    typed = summary(capsys, *ARGS)
    from_toml = summary(capsys, "--config", str(tmp_path / "run.toml"))
    from_yaml = summary(capsys, "--config", str(tmp_path / "run.yaml"))
    assert json.dumps(from_toml, indent=2) == json.dumps(typed, indent=2) == json.dumps(from_yaml, indent=2)
    assert typed["config"] == {
        "design": "baseline-h100", "machines": "2", "model": "llama2-70b", "workload": "coding", "rps": 3.0,
        "duration": 20.0, "seed": 7, "arrivals": "auto", "json": True, "memory-utilization": 0.9, "quiet": True,
        "trace-max-events": 500000, "machine-scheduler": "sarathi", "chunk-size": 256, "no-mixed-pool": False,
        "kv-pull": False, "policy": "", "perf-model": "auto", "decode-lookup": "batch-size", "prefix-caching": True, "block-size": 16}
    assert typed["workload"] == {"name": "coding", "rps": 3.0, "duration_s": 20.0}
    assert typed["cluster_label"] == "baseline-h100 (2 machines)"


def test_the_command_line_wins_over_the_file(tmp_path, capsys):
    (tmp_path / "run.toml").write_text(TOML)
    over = summary(capsys, "--config", str(tmp_path / "run.toml"), "--rps", "5", "--machine-scheduler", "vllm",
                   "--chunk-size", "0")
    typed = summary(capsys, "--design", "baseline-h100", "--machines", "2", "--rps", "5", "--duration", "20",
                    "--seed", "7", "--machine-scheduler", "vllm", "--chunk-size", "0")
    assert over["workload"]["rps"] == 5.0 and over["config"]["machine-scheduler"] == "vllm"
    assert over == typed


def test_a_run_repeats_from_its_own_summary(tmp_path, capsys):
    first = summary(capsys, *ARGS, "--out", str(tmp_path / "a"))
    again = summary(capsys, "--config", str(tmp_path / "a" / "summary.json"))
    assert again == first
    written = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert read_config(tmp_path / "a" / "summary.json") == written["config"]


def test_an_unknown_key_is_one_error_line_with_the_close_matches(tmp_path, capsys):
    (tmp_path / "run.toml").write_text('rsp = 3\nprompt_machine = 2\nzzz = 1\n')
    code, out, err = run(capsys, "simulate", "--config", str(tmp_path / "run.toml"))
    assert code == 2 and out == ""
    assert err == (f"error: --config {tmp_path / 'run.toml'}: unknown options 'rsp' (did you mean rps?), "
                   "'prompt_machine' (did you mean prompt-machines, prompt-cap, token-machines?), 'zzz'; "
                   "`splitserve simulate --help` lists them\n")


@pytest.mark.parametrize("name, text, expect", [
    ("run.toml", 'rps = "fast"\n', "error: Invalid value for '--rps'"),
    ("run.toml", "rps = [\n", "error: --config {path}: not valid TOML: "),
    ("run.yaml", "rps: [\n", "error: --config {path}: not valid YAML: "),
    ("run.yaml", "- 1\n- 2\n", "error: --config {path}: the file must hold a table of options, got list"),
    ("run.ini", "rps = 3\n", "error: --config {path}: give a .toml, .yaml, .yml or .json file"),
    ("run.toml", 'rps = 3\nrps_ = 2\n', "error: --config {path}: unknown option 'rps_' (did you mean rps?)"),
    ("run.yaml", "rps: 3\nrps_: 2\n", "error: --config {path}: unknown option 'rps_' (did you mean rps?)"),
    ("run.toml", 'duration = 5\nrps = 3\ndesign = "nope"\n', "error: unknown design 'nope'"),
])
def test_a_bad_file_is_one_error_line(tmp_path, capsys, name, text, expect):
    path = tmp_path / name
    path.write_text(text)
    code, out, err = run(capsys, "simulate", "--quiet", "--config", str(path))
    assert code == 2 and out == ""
    assert err.startswith(expect.format(path=path)) and err.count("\n") == 1, err


def test_a_key_given_twice_is_an_error(tmp_path, capsys):
    (tmp_path / "run.toml").write_text("prompt-machines = 2\nprompt_machines = 3\n")
    code, _, err = run(capsys, "simulate", "--config", str(tmp_path / "run.toml"))
    assert code == 2 and err == f"error: --config {tmp_path / 'run.toml'}: prompt-machines is given twice\n"


PROVISION = ["--objective", "cost", "--rps", "2", "--design", "splitwise-hh", "--max-prompt", "2", "--max-token",
             "2", "--duration", "10", "--workers", "1", "--no-cache"]


def provision(capsys, *args) -> dict:
    code, out, err = run(capsys, "provision", "--json", "--quiet", *args)
    assert code == 0, err
    res = json.loads(out)
    res["search"].pop("wall_s")
    return res


def test_provision_takes_a_config_file_and_keeps_it(tmp_path, capsys):
    (tmp_path / "p.yaml").write_text("objective: cost\nrps: 2\ndesign: [splitwise-hh]\nmax_prompt: 2\n"
                                     "max-token: 2\nduration: 10\nworkers: 1\nno-cache: true\n")
    typed = provision(capsys, *PROVISION)
    filed = provision(capsys, "--config", str(tmp_path / "p.yaml"))
    assert filed == typed
    assert typed["best"]["design"] == "splitwise-hh" and typed["config"]["design"] == ["splitwise-hh"]
    assert typed["config"]["max-prompt"] == 2 and typed["config"]["no-cache"] is True
    (tmp_path / "p.json").write_text(json.dumps({**typed, "search": {}}))
    assert provision(capsys, "--config", str(tmp_path / "p.json")) == typed   # again from its provision.json
    one = provision(capsys, "--config", str(tmp_path / "p.yaml"), "--max-token", "1")
    assert one["config"]["max-token"] == 1 and one["limits"] != typed["limits"]


def test_compare_takes_a_config_file_and_keeps_it(tmp_path, capsys):
    args = ["--system", "vllm", "--system", "splitwise", "--machines", "2", "--duration", "10", "--tolerance",
            "0.5", "--curve-points", "0", "--max-rps", "10", "--no-cache", "--quiet", "--workers", "1"]
    assert main(["compare", "--out", str(tmp_path / "a"), *args]) == 0
    (tmp_path / "c.toml").write_text('system = ["vllm", "splitwise"]\nmachines = 2\nduration = 10\ntolerance = 0.5\n'
                                     'curve-points = 0\nmax-rps = 10\nno-cache = true\nquiet = true\nworkers = 1\n')
    assert main(["compare", "--out", str(tmp_path / "b"), "--config", str(tmp_path / "c.toml")]) == 0
    capsys.readouterr()
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in "ab")
    for r in (a, b):
        r["search"].pop("wall_s")
        r["config"].pop("out")
    assert a == b
    assert a["config"]["system"] == ["vllm", "splitwise"] and a["budget"]["machines"] == 2
