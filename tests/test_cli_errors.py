"""Bad input gets one clear `error:` line and a non-zero exit, never a traceback."""

import json

import pytest

from splitserve.cli import main

SMALL = ["simulate", "--duration", "5", "--rps", "2", "--quiet"]


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args, expect", [
    (["--design", "splitwise-xx"], "unknown design 'splitwise-xx'; choose one of"),
    (["--model", "gpt-5"], "unknown model"),
    (["--workload", "chat"], "unknown workload"),
    (["--design", "splitwise-hh", "--prompt-machines", "0", "--token-machines", "1"], "--prompt-machines must be at least 1"),
    (["--design", "splitwise-hh", "--prompt-machines", "2", "--token-machines", "-1"], "--token-machines must be at least 1"),
    (["--design", "baseline-h100", "--machines", "0"], "--machines must be at least 1"),
    (["--design", "baseline-h100", "--prompt-machines", "2", "--token-machines", "1"], "unsplit baseline"),
    (["--design", "splitwise-hh", "--prompt-machines", "2"], "needs --prompt-machines N and --token-machines M"),
    (["--rps", "0"], "--rps must be a positive number"),
    (["--rps", "-3"], "--rps must be a positive number"),
    (["--duration", "0"], "--duration must be positive"),
    (["--rps", "fast"], "invalid value for '--rps'"),
    (["--no-such-flag"], "no such option"),
    (["--chunk-size", "-1"], "--chunk-size must be 0"),
    (["--kv-pull"], "--kv-pull needs --no-mixed-pool"),
    (["--design", "baseline-h100", "--machines", "2*dgx-nope"], "unknown hardware 'dgx-nope'"),
    (["--design", "baseline-h100", "--machines", "2", "--tp", "16"], "tensor parallel 16 must be between 1 and 8"),
    (["--design", "baseline-h100", "--machines", "2", "--pp", "0"], "pipeline stages must be at least 1"),
    (["--design", "splitwise-hh", "-p", "1", "-t", "1", "--tp", "1"], "does not fit on 1 GPUs"),
])
def test_bad_arguments(capsys, args, expect):
    code, out, err = run(capsys, *SMALL, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert expect.lower() in lines[0].lower()
    assert "Traceback" not in err + out


def write(tmp_path, text):
    p = tmp_path / "trace.csv"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("body, expect", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,12,x\n", "line 2"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,0,5\n", "line 2"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,-1\n", "line 2"),
    ("TIMESTAMP,Prompt,Output\n2023-11-16 18:17:03.9799600,10,1\n", "ContextTokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
])
def test_malformed_trace(capsys, tmp_path, body, expect):
    code, out, err = run(capsys, *SMALL, "--workload", write(tmp_path, body))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err
    assert expect.lower() in lines[0].lower(), lines[0]


def test_missing_trace_file(capsys, tmp_path):
    code, _, err = run(capsys, *SMALL, "--workload", str(tmp_path / "nope.csv"))
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_workload_that_does_not_fit_in_memory(capsys, tmp_path):
    # one llama2-70b request of 2M tokens: more KV than a DGX-H100 holds (~1.33M tokens)
    trace = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,2000000,5\n")
    code, _, err = run(capsys, *SMALL, "--workload", trace)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("error: request 0") and "KV cache" in line and "dgx-h100" in line


def test_model_that_does_not_fit_in_memory(capsys):
    code, _, err = run(capsys, *SMALL, "--model", "bloom-176b", "--memory-utilization", "0.5")
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ") and "bloom-176b" in line


def test_json_summary_has_the_contract_keys(capsys, tmp_path):
    code, out, err = run(capsys, *SMALL, "--json", "--out", str(tmp_path / "run"))
    assert code == 0, err
    s = json.loads(out)
    for key in ("requests", "completed", "failed", "throughput_rps"):
        assert isinstance(s[key], (int, float))
    for key in ("ttft_s", "tbt_s", "e2e_s"):
        assert set(s[key]) >= {"p50", "p90", "p99", "mean"}
    assert isinstance(s["slo"]["met"], bool)
    assert s["cluster"]["cost_per_hour"] == 4 * 38.0 + 1 * 38.0   # default 4P + 1T DGX-H100
    assert s["cluster"]["power_kw"] > 0 and s["sim"]["events"] > 0 and s["sim"]["wall_s"] > 0
    assert s["completed"] == s["requests"] > 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == s


@pytest.mark.parametrize("out_dir, expect", [
    ("/proc/splitserve-cannot-make-this", "No such file or directory: /proc/splitserve-cannot-make-this"),
    ("{file}/sub", "Not a directory"),
])
def test_unwritable_output_directory(capsys, tmp_path, out_dir, expect):
    f = tmp_path / "a-file"
    f.write_text("x")
    code, out, err = run(capsys, *SMALL, "--out", out_dir.format(file=f))
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ") and expect in line and "Traceback" not in err + out
