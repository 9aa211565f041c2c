"""The harness's own tests: what a run of them needs beyond the harness's plugin.

``HARNESS_FAILURE_LOG=PATH`` appends each failure's report to PATH the moment it arrives (in the
pytest-xdist controller too), so a run stopped at its time limit, which never prints its summary, still
leaves every failure it had seen with its traceback (the GPU check's tests step sets it).

``@pytest.mark.long_running`` marks a test that runs a whole suite, a benchmark or a chain of child
processes (tens of seconds here, more on a GPU runner). Such tests start first, one at the head of each
xdist worker's first share of the collection, so that the run ends with short tests on every worker
instead of one long test started last (the GPU check's tests step had stopped at its limit waiting for one).
"""

from __future__ import annotations

import os

import pytest

_failure_log: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _failure_log
    config.addinivalue_line("markers", "long_running: a long test, started first on its own xdist worker")
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) writes; workers report to it
        _failure_log = os.environ.get("HARNESS_FAILURE_LOG") or None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _failure_log and report.failed:
        with open(_failure_log, "a") as log:
            log.write(f"{'=' * 30} {report.nodeid} ({report.when}) {'=' * 30}\n{report.longreprtext}\n\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # pytest-xdist's load and worksteal schedulers hand each worker a contiguous share of the collection
    # first; every worker collects, and must order, the same items.
    long_running = [item for item in items if item.get_closest_marker("long_running")]
    if not long_running:
        return
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    share = max(1, len(items) // workers)
    ordered: list[pytest.Item | None] = [None] * len(items)
    for position, item in enumerate(long_running):
        ordered[min(len(items) - 1, (position % workers) * share + position // workers)] = item
    rest = iter(item for item in items if not item.get_closest_marker("long_running"))
    items[:] = [item if item is not None else next(rest) for item in ordered]
