"""The pruned searches return exactly what brute force returns, on random monotone inputs."""

from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.provision.search import (Oracle, RateLattice, brute_force_min_split, first_true,
                                         max_rate, min_split)


@st.composite
def staircases(draw):
    """A random up-set of a P x T grid: column p is feasible from t = edge[p] on (T + 1: never);
    edges do not increase with p, so more prompt machines never hurt."""
    P = draw(st.integers(1, 25))
    T = draw(st.integers(1, 25))
    steps = draw(st.lists(st.integers(0, T + 1), min_size=P, max_size=P))
    edge = sorted(steps, reverse=True)
    return P, T, edge


def _keys(draw_w):
    wp, wt = draw_w
    return lambda p, t: (wp * p + wt * t, p + t, p)


@settings(max_examples=300, deadline=None)
@given(staircases(), st.tuples(st.floats(0.1, 10), st.floats(0.1, 10)), st.integers(1, 4))
def test_min_split_equals_brute_force(case, weights, width):
    P, T, edge = case
    key = _keys(weights)
    feasible = lambda p, t: t >= edge[p - 1]
    calls = []

    def batch(points):
        calls.append(points)
        return [feasible(p, t) for p, t in points]

    oracle = Oracle(batch)
    got = min_split(oracle, P, T, key, width=width)
    assert got == brute_force_min_split(feasible, P, T, key)
    assert oracle.asked <= P * T
    assert all(len(c) <= width for c in calls)


def test_min_split_prunes_a_large_grid():
    """A 70 x 70 grid whose cheapest splits are (15, 3) and (16, 2) (the tie goes to fewer prompt
    machines): found with a few dozen probes, not 4,900."""
    P = T = 70
    feasible = lambda p, t: p >= 15 and t >= 2 and p + 3 * t >= 22
    key = lambda p, t: (p + t, p + t, p)
    oracle = Oracle(lambda pts: [feasible(*pt) for pt in pts])
    assert min_split(oracle, P, T, key) == brute_force_min_split(feasible, P, T, key) == (15, 3)
    assert oracle.asked < 40


@settings(max_examples=200, deadline=None)
@given(st.integers(-5, 60), st.integers(-5, 60), st.integers(1, 5), st.integers(-10, 70))
def test_first_true_finds_the_edge(a, span, width, edge):
    b = a + span
    got = first_true(a, b, lambda xs: [x >= edge for x in xs], width)
    expect = next((x for x in range(a, b + 1) if x >= edge), None)
    assert got == expect


@settings(max_examples=200, deadline=None)
@given(st.floats(0.5, 500), st.integers(1, 4), st.sampled_from([0.01, 0.02, 0.05]))
def test_max_rate_is_the_last_lattice_rate_that_passes(capacity, width, tol):
    lat = RateLattice(tol)
    got = max_rate(lambda rs: [r <= capacity for r in rs], lat, 0.5, 1000, width)
    passing = [lat.rate(k) for k in range(lat.index(0.5), lat.index(1000) + 1) if lat.rate(k) <= capacity]
    assert got == (max(passing) if passing else None)
    if got is not None:
        assert capacity / (1 + tol) <= got * (1 + 1e-9) and got <= capacity


@settings(max_examples=300, deadline=None)
@given(st.integers(-200, 400), st.sampled_from([0.01, 0.02, 0.05, 0.1]))
def test_lattice_index_inverts_rate(k, tol):
    lat = RateLattice(tol)
    assert lat.index(lat.rate(k)) == k
    assert lat.index(lat.rate(k) * (1 + tol / 2)) == k
