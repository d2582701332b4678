"""The twin at issue 27's bounds (twin/bounds.py): five live runs on this machine (coding and
conversation; Splitwise 1P+1T, and the unsplit baseline with 4 mixed workers pinned two to each of
the 2 cores; Splitwise at 35% of the predicted capacity for 20 s, the baseline at 30% for 30 s;
outputs <= 8 tokens; and coding on Splitwise with prompts <= 16 tokens, where the serving path is
a large part of TTFT) against their simulations, at the host's speed during each run and with its
steps' spread about it (those of its lone steps after each worker's warm-up; the model keeps every
other term to predict).

- Both designs: every P50 within 15% and every P90 within 25% (the issue's bounds). The baseline
  was held at 25% on its P50s until the profile's mixed steps were found to be decode steps
  (twin/profiler.measure_mixed: the CI grid's engine ran 8 sequences at most, so a prompt joining
  8 or 16 decodes waited for the next step): the model then took a mixed step as the larger of
  its prompt and its decodes, 4-14% short of the measured steps, where their sum fits within 3%.
  Measured right, 12 of 12 live baseline runs held 15% on their P50s (to 8.9%) and 25% on their
  P90s (to 20.2%); before, 13 of 14 held 15%, the miss at the edge between the two heaps of its
  steps (alone on their core or sharing it, 2x). Then one CI run put the coding baseline's E2E
  P50 at -16.9%: at 35% its P50s were still near that edge (resampled, they move 4-6%; at 30% and
  30 s, under 1%), so the baseline now runs there (twin/bounds.py LOAD, DURATION).
  benchmarks/twin/README.md has the runs.
- Each term taken out (twin/bounds.py `controls_failing`, of the model without the spread's draws)
  must put out of the issue's bounds a cell that model kept within them, in at least one run: the
  co-run slowdown with the cores' time-sharing, the KV transfer (with 8-token outputs the hand-over
  delays a split request's second token by about a decode step: TBT's tail) and the serving path
  (its requests' own few ms: the short prompts' TTFT).
- The step logs hold every planned prompt token once and every decode once (the first token is
  the prefill's).
The errors at the profile's speed are printed beside (a prediction, without the run's speed)."""

from __future__ import annotations

import warnings

import pytest

from splitserve.twin.bounds import HELD_AT, RUNS, check_run, controls_failing, out_of_bounds, table
from splitserve.twin.machine import TERMS, load_machine_profile


@pytest.fixture(scope="module")
def results(profile_dir, tmp_path_factory):
    machine = load_machine_profile(profile_dir)
    out = {name: check_run(name, machine, profile_dir, tmp_path_factory.mktemp("bounds"), calibrate=False)
           for name in RUNS}
    print("\n" + table(out))
    # a record of the margins, not a check: every run's cells at the held speed, in the warnings
    # summary of every run of the test (CI's included, whose captured output is not kept)
    warnings.warn(worst_line(out) + "\n" + table(out, (HELD_AT,)))
    return out


def worst_line(results: dict) -> str:
    """Each design's largest P50 and P90 error at the run's speed: in the warnings summary of every
    run of the test (CI's included), the margins of each run on record."""
    def worst(design: str, p: str) -> float:
        return max((e for n, r in results.items() if design in n for k, e in r["errors"][HELD_AT].items() if p in k),
                   key=abs)
    return (f"twin bounds on this machine, the largest errors: splitwise P50 {worst('splitwise', 'P50'):+.1%}, "
            f"P90 {worst('splitwise', 'P90'):+.1%}; baseline P50 {worst('baseline', 'P50'):+.1%}, "
            f"P90 {worst('baseline', 'P90'):+.1%}")


@pytest.mark.parametrize("name", list(RUNS))
def test_a_live_run_within_the_bounds(results, name):
    r = results[name]
    assert r["failed"] == 0 and r["requests"] > 20, r
    assert all(logged == planned for logged, planned in r["accounted"].values()), r["accounted"]
    held = r["errors"][HELD_AT]
    assert not out_of_bounds(held), (held, r["speed"])


def test_each_term_taken_out_breaks_a_run(results):
    # in at least one run, a cell the model kept within the bounds goes out without it
    failing = controls_failing(results)
    assert set(failing) == set(TERMS) and all(failing.values()), (
        failing, {n: {t: r["errors"][f"without {t}"] for t in TERMS} for n, r in results.items()})
