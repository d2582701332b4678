"""Random request streams for the simulator's property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from splitserve.workload import RequestSpec


@st.composite
def request_specs(draw, max_requests: int = 40, max_gap_s: float = 0.3, max_prompt: int = 4000,
                  max_output: int = 200) -> list[RequestSpec]:
    """1 to `max_requests` requests, arriving at most `max_gap_s` apart."""
    t, specs = 0.0, []
    for _ in range(draw(st.integers(1, max_requests))):
        t += draw(st.floats(0.0, max_gap_s))
        specs.append(RequestSpec(t, draw(st.integers(1, max_prompt)), draw(st.integers(1, max_output))))
    return specs
