"""`splitserve bench` on the command line: bad input is one `error:` line and exit 2; a good run
writes summary.json and prints it with --json. The server is the TEST DOUBLE in fake_server.py."""

import json

import pytest

from fake_server import FakeServer, free_port, running
from splitserve.cli import main


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def args(url, tmp_path, *extra):
    return ["bench", "--url", url, "--rps", "5", "--duration", "1", "--out", str(tmp_path / "b"),
            "--max-prompt-tokens", "8", "--max-tokens-cap", "4", *extra]


@pytest.fixture(scope="module")
def server():
    with running(FakeServer()) as fake:
        yield f"http://127.0.0.1:{fake.port}"


@pytest.mark.parametrize("extra, expect", [
    (["--rps", "0"], "--rps must be a positive number"),
    (["--rps", "-2"], "--rps must be a positive number"),
    (["--duration", "0"], "--duration must be positive"),
    (["--workload", "chat"], "unknown workload 'chat'"),
    (["--workload", "missing.csv"], "not found"),
    (["--max-tokens-cap", "0"], "--max-tokens-cap must be at least 1"),
    (["--max-prompt-tokens", "-1"], "--max-prompt-tokens must be at least 1"),
    (["--timeout", "0"], "--timeout must be positive"),
    (["--token-id-min", "9", "--token-id-max", "3"], "--token-id-min <= --token-id-max"),
    (["--rps", "lots"], "invalid value for '--rps'"),
    (["--endpoint", "chat", "--prompt-format", "ids"], "--endpoint chat sends text messages"),
    (["--dataset", "sharegpt"], "--dataset sharegpt needs --dataset-path"),
    (["--dataset", "sharegpt", "--dataset-path", "missing.json"], "--dataset-path missing.json: file not found"),
    (["--goodput", "ttft:fast"], "--goodput ttft: the limit must be a positive number"),
    (["--goodput", "itl:5"], "--goodput takes KEY:MILLISECONDS"),
    (["--percentiles", "50,120"], "--percentiles takes numbers in (0, 100]"),
    (["--burstiness", "0"], "--burstiness must be positive"),
    (["--max-concurrency", "0"], "--max-concurrency must be at least 1"),
    (["--max-failure-ratio", "2"], "--max-failure-ratio must be between 0 and 1"),
    (["--dataset", "random", "--random-range-ratio", "1"], "--random-range-ratio must be in [0, 1)"),
    (["--num-prompts", "0"], "--num-prompts must be at least 1"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, server, extra, expect):
    code, out, err = run(capsys, *args(server, tmp_path, *extra))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert expect.lower() in lines[0].lower(), lines[0]
    assert "Traceback" not in out + err and not (tmp_path / "b").exists()


@pytest.mark.parametrize("url, expect", [
    (None, "cannot reach the server at http://127.0.0.1:"),
    ("localhost:8000", "--url must look like http://HOST:PORT"),
])
def test_bad_url(capsys, tmp_path, url, expect):
    url = url or f"http://127.0.0.1:{free_port()}"
    code, out, err = run(capsys, *args(url, tmp_path))
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ") and expect in line, line


def test_duration_or_num_prompts_is_needed(capsys, tmp_path, server):
    code, _, err = run(capsys, "bench", "--url", server, "--rps", "5", "--out", str(tmp_path / "b"))
    assert code == 2 and err == "error: give --duration (seconds of arrivals) or --num-prompts\n"


def test_missing_url_is_a_usage_error(capsys):
    code, _, err = run(capsys, "bench", "--rps", "1", "--duration", "1", "--out", "x")
    assert code == 2 and err.startswith("error: ") and "--url" in err


def test_json_run_prints_the_summary_it_writes(capsys, tmp_path, server):
    code, out, err = run(capsys, *args(server + "/v1", tmp_path, "--json", "--seed", "4"))
    assert code == 0, err
    s = json.loads(out)
    assert json.loads((tmp_path / "b" / "summary.json").read_text()) == s
    assert s["requests"] == s["completed"] > 0 and s["bench"]["url"] == server   # /v1 dropped
    assert s["bench"]["seed"] == 4 and s["bench"]["max_tokens_cap"] == 4
    assert 0.050 <= s["ttft_s"]["p50"] < 0.050 + 0.015      # the double's 50 ms + overhead


def test_table_run(capsys, tmp_path, server):
    code, out, err = run(capsys, *args(server, tmp_path))
    assert code == 0, err
    assert "TTFT" in out and "TBT" in out and "E2E" in out and "completed" in out
    assert "sizes capped" in out and "summary.json" in out
