"""The order of a collection for pytest-xdist: ``long_running`` tests first, ``same_worker`` groups together.

:func:`order_for_workers` does it; ``docs/adding-a-component.md`` says when to use each marker."""

from __future__ import annotations

import os

import pytest

__all__ = ["MARKERS", "order_for_workers"]

# same_worker, not pytest-xdist's xdist_group: that mark acts only under --dist loadgroup (ignored under the
# default load that -n N selects), and loadgroup deals out whole groups and single tests from a queue in
# collection order, with no contiguous shares for the long tests to head; it also renames grouped node ids.
MARKERS = {
    "long_running": "a long test (a whole suite, a benchmark, a chain of child processes): started first, "
                    "at the head of its own pytest-xdist worker's share",
    "same_worker": "same_worker(NAME): tests sharing a costly per-process resource (a pool of rank processes) "
                   "run together at the head of one pytest-xdist worker's share",
}


def _units(items: list[pytest.Item]) -> list[list[pytest.Item]]:
    """The marked tests as units that each go to one worker's head, in collection order."""
    units: list[list[pytest.Item]] = []
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        group = item.get_closest_marker("same_worker")
        if group is not None:
            if len(group.args) != 1 or not isinstance(group.args[0], str):
                raise pytest.UsageError(f"{item.nodeid}: same_worker takes one group name, e.g. "
                                        f"@pytest.mark.same_worker('rank-pool'); got {group.args!r}")
            name = group.args[0]
            if name not in groups:
                groups[name] = []
                units.append(groups[name])
            groups[name].append(item)
        elif item.get_closest_marker("long_running") is not None:
            units.append([item])
    return units


_ORDERED = pytest.StashKey[bool]()


def order_for_workers(config: pytest.Config, items: list[pytest.Item], *, workers: int | None = None) -> None:
    """Reorder ``items`` in place: unit ``k`` (a ``long_running`` test, or a ``same_worker`` group in
    collection order) at the head of worker ``k mod workers``'s share, the other tests in their order
    around them. ``workers`` defaults to the run's pytest-xdist worker count (1 without xdist). Once per
    run: a second call (the plugin's and a project's hook) leaves the order as the first made it.

    Why the head of a share: pytest-xdist's ``load`` and ``worksteal`` schedulers hand each worker a
    contiguous share of the collection first (``worksteal`` later moves tests from the tail of a busy
    worker's queue to an idle one), so a test at the head of a share starts at once on its own worker,
    and tests placed together there run on that worker, in order. A ``long_running`` test started last
    would leave one worker running it after the others finished; a ``same_worker`` group shares a resource
    every process builds once at a cost of seconds (a rank pool), so one worker builds it instead of several.
    Every worker must order the same items, so the order depends only on the collection and the worker
    count; a collection with neither marker is left exactly as it was.

    A run that stops at its first failure (``-x``, ``--maxfail``, as the kill matrix runs a mutant) runs the
    marked tests last, in collection order: there the time to that failure counts, and long tests, or
    rank-pool tests that start a pool of ranks per run, placed first delayed it."""
    if config.stash.get(_ORDERED, False):
        return
    config.stash[_ORDERED] = True
    units = _units(items)
    if not units:
        return
    marked = {id(item) for unit in units for item in unit}
    if config.getoption("maxfail", 0):
        items[:] = [item for item in items if id(item) not in marked] + [item for item in items if id(item) in marked]
        return
    if workers is None:
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    workers = max(1, workers)
    share = max(1, len(items) // workers)
    ordered: list[pytest.Item | None] = [None] * len(items)
    next_free = [min(worker * share, len(items) - 1) for worker in range(workers)]
    for number, unit in enumerate(units):
        worker = number % workers
        for item in unit:
            position = next_free[worker]
            # a head longer than its share runs on into the next share's free places
            while position < len(items) and ordered[position] is not None:
                position += 1
            if position == len(items):
                position = ordered.index(None)
            ordered[position] = item
            next_free[worker] = position + 1
    rest = iter([item for item in items if id(item) not in marked])
    items[:] = [item if item is not None else next(rest) for item in ordered]
