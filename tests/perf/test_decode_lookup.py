"""--decode-lookup batch-tokens: a decode batch of b requests takes the profile's median token time
by batch tokens (prompt size x batch size), a line between the medians read at x = b, as
SplitwiseSim's DatabasePerformanceModel reads it; the default leaves the profile model as it is."""

import csv
from pathlib import Path

import pytest

from splitserve.catalog import load_hardware, load_model
from splitserve.errors import UserError
from splitserve.perf import make_perf_model
from splitserve.perf.decode_lookup import BatchTokensDecode, batch_token_lines, extrapolating_line
from splitserve.perf.profile import ProfilePerfModel

# (prompt_size, batch_size, token_size, prompt_ms, token_ms) of Llama2-70B on an H100 at tp 8.
ROWS = [
    (128, 1, 128, 40.0, 30.0),
    (128, 1, 128, 40.0, 30.0),      # a repeated row counts: median(30, 30, 36) = 30, not 33
    (128, 1, 128, 40.0, 36.0),
    (256, 1, 128, 50.0, 28.0),
    (512, 1, 128, 60.0, 31.0),
    (256, 2, 128, 70.0, 33.0),      # batch tokens 512 too: median(31, 33) = 32
    (512, 64, 128, 3000.0, 50.0),   # batch tokens 32,768
]


@pytest.fixture()
def profile(tmp_path: Path) -> Path:
    path = tmp_path / "profile.csv"
    cols = ["model", "hardware", "prompt_size", "batch_size", "token_size", "peak_power", "average_power",
            "prompt_time", "token_time", "e2e_time", "tensor_parallel"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for p, b, t, pt, tt in ROWS:
            w.writerow(["llama2-70b", "h100-80gb", p, b, t, 0, 0, pt, tt, 0, 8])
    return path


def perf(profile: Path, lookup: str):
    return make_perf_model(load_model("llama2-70b"), load_hardware("dgx-h100"), 8, profile,
                           decode_lookup=lookup)[0]


def test_the_medians_by_batch_tokens_count_every_row(profile: Path) -> None:
    from splitserve.perf.profile_fit import read_profile_rows
    xs, _, ys = batch_token_lines(read_profile_rows(profile, unique=False))
    assert xs == [128.0, 256.0, 512.0, 32768.0]
    assert ys == pytest.approx([0.030, 0.028, 0.032, 0.050])


@pytest.mark.parametrize("batch, ms", [
    (1, 30.0 + (28.0 - 30.0) * (1 - 128) / 128),     # 31.984375: the first segment, extended below 128
    (64, 31.0),                                      # 30 + (-2 / 128) * (64 - 128)
    (192, 29.0),                                     # half way from 128 (30) to 256 (28)
    (384, 30.0),                                     # half way from 256 (28) to 512 (32)
    (512, 32.0),                                     # on the 512 point
])
def test_a_decode_batch_of_n_reads_the_line_at_n(profile: Path, batch: int, ms: float) -> None:
    model = perf(profile, "batch-tokens")
    assert isinstance(model, BatchTokensDecode)
    for context in (batch * 100, batch * 4000):      # context does not enter
        assert model.token_time(batch, context) == pytest.approx(ms / 1000)


def test_prompts_and_the_mixed_rule_are_the_profile_models(profile: Path) -> None:
    base, model = perf(profile, "batch-size"), perf(profile, "batch-tokens")
    assert model.prompt_time(700) == base.prompt_time(700)
    assert model.mixed_time(700, 192, 192 * 600) == max(base.prompt_time(700 + 192), 0.029)
    assert model.source.endswith("+decode-lookup:batch-tokens")


def test_the_default_is_the_profile_model_untouched(profile: Path) -> None:
    base = perf(profile, "batch-size")
    assert type(base) is ProfilePerfModel
    fitted = ProfilePerfModel.from_csv(profile, "llama2-70b", "h100-80gb", 8)
    for b in (1, 64, 192, 512):
        assert base.token_time(b, b * 576) == fitted.token_time(b, b * 576) != perf(profile, "batch-tokens").token_time(b, 0)


def test_the_line_extends_its_end_segments() -> None:
    xs, ys = [1.0, 2.0, 4.0], [10.0, 20.0, 20.0]
    assert extrapolating_line(xs, ys, 0.0) == 0.0
    assert extrapolating_line(xs, ys, 3.0) == 20.0
    assert extrapolating_line(xs, ys, 8.0) == 20.0


def test_batch_tokens_needs_profile_rows(profile: Path) -> None:
    with pytest.raises(UserError, match="--decode-lookup batch-tokens"):
        make_perf_model(load_model("llama2-70b"), load_hardware("dgx-h100"), 8, None, decode_lookup="batch-tokens")
    with pytest.raises(UserError, match="--decode-lookup must be"):
        make_perf_model(load_model("llama2-70b"), load_hardware("dgx-h100"), 8, profile, decode_lookup="prompt")
