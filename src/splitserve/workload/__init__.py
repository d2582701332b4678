"""Workloads: the requests a run replays, in arrival order, generated lazily in blocks so that
memory stays flat however long the run (a 2.5M-request hour costs no more than a minute).

`make_workload(source, rps=, duration=, seed=)` where `source` is `coding` or `conversation`
(synthetic sizes fitted to the Azure 2023 traces, Poisson arrivals) or a trace CSV path (its own
timestamps by default, time-scaled to `rps` when given, replayed back to back when shorter than
`duration`). `rate_profile=` (workload/rate.py: "0:5,60:20,120:5" or "sin:10:5:600"; or a measured
rate shape, workload/shape.py: "azure-code", whose mean is `rps`) makes Poisson arrivals
non-homogeneous, drawn by thinning with the same seeded generator, block by block, so memory
stays flat as well.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import UserError
from .conversations import SHAPES, Conversations, make_conversations
from .rate import RateProfile, parse_rate_profile, thinned_arrivals
from .shape import ShapeProfile, is_shape, parse_shape
from .synthetic import SYNTHETIC, size_model
from .trace import Trace, load_trace

BLOCK = 4096
DEFAULT_SYNTHETIC_DURATION = 60.0


class RequestSpec(NamedTuple):
    arrival: float          # seconds from the start of the run
    prompt_tokens: int
    output_tokens: int


# a RequestSpec from an (arrival, prompt, output) tuple, in C: RequestSpec(...) runs an interpreted
# __new__, a fifth of a day-long simulation's generation of its 6 M requests
_spec = partial(tuple.__new__, RequestSpec)


@dataclass(slots=True)
class Workload:
    name: str
    rps: float
    duration: float | None
    seed: int
    arrivals: str                     # "poisson" or "trace"
    max_requests: int | None = None
    max_context: int | None = None
    trace: Trace | None = None
    trace_time_scale: float = 1.0     # trace seconds -> run seconds
    rate_profile: RateProfile | ShapeProfile | None = None   # time-varying Poisson rate; rps is then its mean

    def describe(self) -> str:
        src = self.name if self.trace is None else f"trace {self.name} ({len(self.trace)} requests)"
        dur = f"{self.duration:g} s" if self.duration else f"{self.max_requests} requests"
        if self.rate_profile is not None:
            return (f"{src}, {self.arrivals} arrivals at {self.rate_profile.describe()} (mean "
                    f"{self.rps:g} req/s) for {dur}, seed {self.seed}")
        return f"{src}, {self.arrivals} arrivals at {self.rps:g} req/s for {dur}, seed {self.seed}"

    def __iter__(self) -> Iterator[RequestSpec]:
        left = self.max_requests if self.max_requests is not None else math.inf
        end = self.duration if self.duration is not None else math.inf
        cap = self.max_context
        for arrival, prompt, output in self._blocks():
            if cap is not None:
                output = np.minimum(output, cap - 1)
                prompt = np.minimum(prompt, cap - output)
            past = np.flatnonzero(arrival >= end)          # the run ends at the first arrival past it
            n = int(min(past[0] if past.size else len(arrival), left))
            yield from map(_spec, zip(arrival[:n].tolist(), prompt[:n].tolist(), output[:n].tolist()))
            left -= n
            if n < len(arrival) or left <= 0:
                return

    def _blocks(self):
        rng = np.random.default_rng(self.seed)
        if self.rate_profile is not None:
            sizes = size_model(self.name) if self.trace is None else None
            end = self.duration if self.duration is not None else math.inf
            for arrival, t in thinned_arrivals(rng, self.rate_profile, BLOCK):
                if sizes is not None:
                    yield (arrival, *sizes.sample(rng, len(arrival)))
                else:
                    idx = rng.integers(0, len(self.trace), len(arrival))
                    yield arrival, self.trace.prompt_tokens[idx], self.trace.output_tokens[idx]
                if t >= end:                  # every later candidate lies past the run's end
                    return
        elif self.trace is None:
            sizes = size_model(self.name)
            t = 0.0
            while True:
                gaps = rng.exponential(1.0 / self.rps, BLOCK)
                arrival = t + np.cumsum(gaps)
                t = float(arrival[-1])
                yield (arrival, *sizes.sample(rng, BLOCK))
        else:
            tr = self.trace
            if self.arrivals == "poisson":
                t = 0.0
                while True:
                    idx = rng.integers(0, len(tr), BLOCK)
                    arrival = t + np.cumsum(rng.exponential(1.0 / self.rps, BLOCK))
                    t = float(arrival[-1])
                    yield arrival, tr.prompt_tokens[idx], tr.output_tokens[idx]
            else:
                # replay back to back: the next copy starts one mean gap after the last request
                period = (tr.duration + tr.duration / max(len(tr) - 1, 1)) * self.trace_time_scale
                offset = 0.0
                while True:
                    yield offset + tr.arrival_s * self.trace_time_scale, tr.prompt_tokens, tr.output_tokens
                    offset += period
                    if period <= 0:
                        return


def make_workload(source: str, *, rps: float | None = None, duration: float | None = None,
                  seed: int = 0, arrivals: str = "auto", max_requests: int | None = None,
                  max_context: int | None = None,
                  rate_profile: str | RateProfile | ShapeProfile | None = None,
                  conversation: str | None = None) -> Workload | Conversations:
    if rps is not None and not (math.isfinite(rps) and rps > 0):
        raise UserError(f"rps must be a positive number, got {rps}")
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise UserError(f"duration must be positive seconds, got {duration}")
    if max_context is not None and max_context < 2:
        raise UserError(f"max context must be at least 2 tokens, got {max_context}")
    if arrivals not in ("auto", "poisson", "trace"):
        raise UserError(f"arrivals must be auto, poisson or trace, got {arrivals!r}")
    if source in SHAPES:
        if rate_profile is not None or arrivals == "trace" or max_requests is not None:
            raise UserError(f"{source} is conversations: Poisson starts, closed-loop turns (no rate profile, "
                            f"trace arrivals or request cap)")
        return make_conversations(source, rps=rps, duration=duration, seed=seed, max_context=max_context,
                                  shape=conversation)
    if conversation:
        raise UserError(f"a conversation shape applies to {' and '.join(SHAPES)}, not {source!r}")
    if rate_profile is not None:
        return _profiled(source, rate_profile, duration, seed, arrivals, max_requests, max_context, rps)
    if source in SYNTHETIC:
        if arrivals == "trace":
            raise UserError(f"{source} is synthetic: it has Poisson arrivals, not a trace's")
        model = size_model(source)
        if duration is None and max_requests is None:
            duration = DEFAULT_SYNTHETIC_DURATION
        return Workload(source, rps or model.mean_rps, duration, seed, "poisson",
                        max_requests, max_context)
    if not source.lower().endswith(".csv") and not Path(source).exists():
        size_model(source)                      # raises the unknown-workload error
    trace = load_trace(source)
    native = (len(trace) - 1) / trace.duration if trace.duration > 0 else None
    mode = "trace" if arrivals == "auto" else arrivals
    if mode == "trace" and native is None:
        if rps is None:
            raise UserError(f"{source}: all requests share one timestamp; give --rps or --arrivals poisson")
        mode = "poisson"
    target = rps or native
    if target is None:   # --arrivals poisson: a rate it cannot take from one timestamp
        raise UserError(f"{source}: all requests share one timestamp; give --rps")
    scale = native / target if mode == "trace" and native is not None else 1.0
    if duration is None and max_requests is None:
        duration = trace.duration * scale + 1e-9 if mode == "trace" else len(trace) / target
    return Workload(Path(source).name, target, duration, seed, mode, max_requests, max_context,
                    trace, scale)


def request_workload(source: str, *, rps: float | None = None, duration: float | None = None, seed: int = 0,
                     arrivals: str = "auto", max_requests: int | None = None, max_context: int | None = None,
                     rate_profile: str | RateProfile | ShapeProfile | None = None) -> Workload:
    """`make_workload` where independent requests are wanted: UserError for a conversation shape."""
    wl = make_workload(source, rps=rps, duration=duration, seed=seed, arrivals=arrivals, max_requests=max_requests,
                       max_context=max_context, rate_profile=rate_profile)
    if not isinstance(wl, Workload):
        raise UserError(f"{source} is conversations; this takes a workload of independent requests")
    return wl


def _profiled(source, profile, duration, seed, arrivals, max_requests, max_context, rps) -> Workload:
    """A workload whose Poisson rate follows `profile` (a synthetic one, or a trace's sizes); a rate
    shape's text (workload/shape.py) takes `rps` as its mean."""
    shaped = isinstance(profile, str) and is_shape(profile)
    if rps is not None and not shaped:
        raise UserError("give a rate or a rate profile, not both")
    if arrivals == "trace":
        raise UserError("a rate profile draws Poisson arrivals; it cannot replay a trace's timestamps")
    if isinstance(profile, str):
        profile = parse_shape(profile, rps) if shaped else parse_rate_profile(profile)
    trace = None
    if source in SYNTHETIC:
        size_model(source)
        if duration is None and max_requests is None:
            duration = DEFAULT_SYNTHETIC_DURATION
    else:
        if not source.lower().endswith(".csv") and not Path(source).exists():
            size_model(source)                  # raises the unknown-workload error
        trace = load_trace(source)
        if duration is None and max_requests is None:
            max_requests = len(trace)
    if duration is not None:
        mean = profile.expected(0.0, duration) / duration
    else:                                       # long-run rate: the last segment's, or the sine's mean
        mean = profile.rates[-1] if profile.kind == "piecewise" else profile.mean
    name = source if trace is None else Path(source).name
    return Workload(name, mean, duration, seed, "poisson", max_requests, max_context, trace,
                    rate_profile=profile)
