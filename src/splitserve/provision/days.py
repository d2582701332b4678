"""`provision --day peak-hour|whole` and `--rate-profile SHAPE`: the search's simulations over a day
of traffic shaped as a measured rate shape (workload/shape.py), each scaled so that the shape's
mean is the simulation's rate (--rps, the rate the throughput search tries, batch's stress load).

- `whole`: the day, DAY_S seconds of the shape from its start (a shape shorter than a day, as the
  built-in ones, one hour of the Azure 2023 traces, repeats);
- `peak-hour`: the hour of that day with the most arrivals (`peak_hour`), HOUR_S seconds from
  its start;
- no --day, a --rate-profile: the shape from its start for --duration.

The cache and the workers are as for any search: the shape's text (with the peak hour's start) is
a field of each job (provision/evaluate.py `Job.rate_profile`), a shape file's content part of its
cache key.
"""

from __future__ import annotations

from ..errors import UserError
from ..workload.shape import DAY_S, HOUR_S, is_shape, names_rate, parse_shape, peak_hour

DAYS = ("peak-hour", "whole")
DEFAULT_SHAPES = {"coding": "azure-code", "conversation": "azure-conv"}


def day_shape(workload: str, rate_profile: str | None, day: str | None, backend: str) -> str:
    """The rate shape the simulations follow, checked ("": none, a constant rate): --rate-profile,
    or with --day alone the workload's own trace's (DEFAULT_SHAPES)."""
    if day is not None and day not in DAYS:
        raise UserError(f"--day must be peak-hour or whole, got {day!r}")
    spec = rate_profile or ""
    if not spec and day is not None:
        spec = DEFAULT_SHAPES.get(workload, "")
        if not spec:
            raise UserError(f"--day {day} on workload {workload!r}: give --rate-profile, a rate shape "
                            f"({', '.join(DEFAULT_SHAPES.values())} or a shape file NAME.json)")
    if not spec:
        return ""
    if not is_shape(spec) or names_rate(spec) or ":" in spec:
        raise UserError(f"provision --rate-profile takes a rate shape's name alone (azure-code, azure-conv or a "
                        f"shape file NAME.json), scaled to each simulation's rate; got {spec!r}")
    if spec.lower().endswith(".json") and backend == "ray":
        raise UserError("--backend ray takes a built-in rate shape (a shape file is not shipped to the nodes)")
    parse_shape(spec, 1.0)            # the shape exists and reads
    return spec


def day_span(spec: str, day: str | None, duration: float) -> tuple[str, float]:
    """(the simulations' rate profile text, their seconds of arrivals) for shape `spec` ("": none)."""
    if not spec or day is None:
        return spec, duration
    if day == "whole":
        return spec, DAY_S
    start = peak_hour(parse_shape(spec, 1.0).shape)
    return (f"{spec}:start={start:g}" if start else spec), HOUR_S
