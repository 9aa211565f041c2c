"""The harness's own tests: what a run of them needs beyond the harness's plugin.

``HARNESS_FAILURE_LOG=PATH`` appends each failure's report to PATH the moment it arrives (in the
pytest-xdist controller too), so a run stopped at its time limit, which never prints its summary, still
leaves every failure it had seen with its traceback (the GPU check's tests step sets it).

``@pytest.mark.long_running`` (the harness's marker, :mod:`harness.plugin.xdist_order`) marks a test that runs a
whole suite, a benchmark or a chain of child processes (tens of seconds here, more on a GPU runner): it
starts first, at the head of its own xdist worker's share (the GPU check's tests step had stopped at its
limit waiting for one started last).
"""

from __future__ import annotations

import os

import pytest

from harness.plugin.xdist_order import order_for_workers

_failure_log: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _failure_log
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) writes; workers report to it
        _failure_log = os.environ.get("HARNESS_FAILURE_LOG") or None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _failure_log and report.failed:
        with open(_failure_log, "a") as log:
            log.write(f"{'=' * 30} {report.nodeid} ({report.when}) {'=' * 30}\n{report.longreprtext}\n\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a run of tests/ that the harness's plugin did not activate for: its order all the same
    order_for_workers(config, items)
