"""The planner's ring all-reduce time is the collectives simulation's float, bit for bit (issue 25, bug c)."""

from __future__ import annotations

import math

from hypothesis import given, settings, strategies as st

from sim.engines.collectives import simulate_collective
from sim.search.gradient_sync import ring_allreduce_time

_finite = dict(allow_nan=False, allow_infinity=False)


def _simulated(workers, nbytes, bandwidth, latency):
    return simulate_collective("ring", workers=workers, nbytes=nbytes, latency=latency, bandwidth=bandwidth).time


@settings(max_examples=120, deadline=None)
@given(workers=st.integers(2, 33), nbytes=st.floats(1e-3, 1e12, **_finite),
       bandwidth=st.floats(1e6, 1e13, **_finite), latency=st.one_of(st.just(0.0), st.floats(0.0, 1e-3, **_finite)))
def test_ring_time_is_the_simulated_float(workers, nbytes, bandwidth, latency):
    assert ring_allreduce_time.__wrapped__(workers, nbytes, bandwidth, latency) == \
        _simulated(workers, nbytes, bandwidth, latency)


def test_unlimited_link_and_trivial_rings():
    assert ring_allreduce_time.__wrapped__(4, 100.0, math.inf, 1.0) == _simulated(4, 100.0, math.inf, 1.0) == 6.0
    assert ring_allreduce_time.__wrapped__(1, 1e9, 1e9, 1e-5) == 0.0
    assert ring_allreduce_time.__wrapped__(8, 0.0, 1e9, 1e-5) == 0.0


def test_the_multiplied_closed_form_would_fail():
    """The closed form written as a product (the docstring's formula before this fix) is not the simulated float:
    the exact comparison above is sharp enough to see it."""
    differ = 0
    for workers in range(2, 17):
        for nbytes, bandwidth, latency in ((1e9 / 3, 25e9, 5e-6), (7.3e8, 4.5e11, 1.7e-6)):
            product = 2 * (workers - 1) * (latency + nbytes / workers / bandwidth)
            differ += product != _simulated(workers, nbytes, bandwidth, latency)
    assert differ > 0
