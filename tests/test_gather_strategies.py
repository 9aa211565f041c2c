"""The gather strategies' size edges (harness.gather.strategies)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.gather.strategies import around_powers_of_two, index_counts, pools


def test_around_powers_of_two_lists_each_edge_and_its_neighbours_in_range():
    assert around_powers_of_two(0, 20) == (0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17)
    assert around_powers_of_two(1000, 1100) == (1023, 1024, 1025)
    assert around_powers_of_two(10, 14) == ()


@settings(max_examples=50, database=None)
@given(data=st.data(), pool=st.integers(1, 4096))
def test_drawn_counts_and_pools_stay_in_the_contract(data, pool):
    assert 0 <= data.draw(index_counts(pool)) <= 2 * pool
    assert 1 <= data.draw(pools) <= 4096
