"""Hypothesis strategies for gather cases: shapes, dtypes, layouts and seeds, never element values.

Values come from a generator seeded by the drawn seed (:mod:`harness.gather.cases`), which keeps
examples small to shrink and reproducible from the failure report."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from hypothesis import strategies as st

from harness.gather.cases import INDEX_DTYPES, INDEX_LAYOUTS, SOURCE_LAYOUTS, BufferSpec, GatherCase, gather_dtypes

__all__ = ["pools", "widths", "index_counts", "gather_cases", "around_powers_of_two", "MAX_BUFFER_ELEMENTS"]

# Caps one buffer so a pool of 4096 with a 2049-wide hidden state stays cheap on a 2-core runner.
MAX_BUFFER_ELEMENTS = 1 << 21



def around_powers_of_two(low: int, high: int) -> tuple[int, ...]:
    """Every ``2**k - 1``, ``2**k`` and ``2**k + 1`` in ``[low, high]``, ascending: where kernels change block,
    tile or vector width, and where an off-by-one in a ``(n - 1) // block`` or an ``n & (n - 1)`` shows."""
    edges = {2**k + step for k in range(max(high, 1).bit_length() + 1) for step in (-1, 0, 1)}
    return tuple(sorted(n for n in edges if low <= n <= high))


# Edges first: pool 1 (every index is 0 or -1), pool 2, and the largest pool the contract names; then pools at and
# around powers of two, then any.
pools = st.one_of(st.sampled_from([1, 2, 3, 4096]), st.sampled_from(around_powers_of_two(1, 4096)),
                  st.integers(1, 4096))
# Odd widths, powers of two, and widths above 1024 (a kernel's per-block width limit).
widths = st.sampled_from([1, 2, 3, 7, 8, 16, 33, 64, 127, 1024, 1025, 2049])


def index_counts(pool: int) -> st.SearchStrategy[int]:
    """Index counts from 0 to twice the pool: 0, 1, odd counts and duplicates all come up, and counts at and
    around the pool and the powers of two are drawn as often as the uniform ones."""
    edges = sorted(set(around_powers_of_two(0, 2 * pool)) | {n for n in (pool - 1, pool, pool + 1) if n >= 0})
    return st.one_of(st.sampled_from([0, 1, 2, 3]), st.sampled_from(edges), st.integers(0, 2 * pool))


@st.composite
def _buffer_spec(draw, *, dtypes: Sequence[torch.dtype], layouts: Sequence[str], rank: int) -> BufferSpec:
    trailing = tuple(draw(widths) for _ in range(rank))
    return BufferSpec(trailing, draw(st.sampled_from(list(dtypes))), draw(st.sampled_from(list(layouts))))


@st.composite
def gather_cases(draw, *, dtypes: Sequence[torch.dtype] | None = None,
                 layouts: Sequence[str] = SOURCE_LAYOUTS, with_hidden: bool | None = None,
                 max_pool: int = 4096) -> GatherCase:
    """Cases over the whole in-process contract: valid, non-negative indices.

    Negative and out-of-range indices are left to the subprocess suite: an unchecked candidate
    kernel could crash the test process on them.
    """
    dtypes = tuple(dtypes or gather_dtypes())
    pool = min(draw(pools), max_pool)
    specs = [
        draw(_buffer_spec(dtypes=dtypes, layouts=layouts, rank=1)),
        draw(_buffer_spec(dtypes=dtypes, layouts=layouts, rank=1)),
        draw(_buffer_spec(dtypes=dtypes, layouts=layouts, rank=0)),
    ]
    hidden = None
    if with_hidden if with_hidden is not None else draw(st.booleans()):
        hidden = draw(_buffer_spec(dtypes=dtypes, layouts=layouts, rank=draw(st.sampled_from([1, 1, 2]))))
        specs.append(hidden)
    widest = max(math.prod(spec.trailing) for spec in specs)
    pool = max(1, min(pool, MAX_BUFFER_ELEMENTS // widest))
    count = draw(index_counts(pool))
    return GatherCase(
        pool=pool, count=count, seed=draw(st.integers(0, 2**32 - 1)),
        index_dtype=draw(st.sampled_from(INDEX_DTYPES)), index_layout=draw(st.sampled_from(INDEX_LAYOUTS)),
        topk_p=specs[0], topk_index=specs[1], output_tokens=specs[2], hidden=hidden,
    )
