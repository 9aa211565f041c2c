"""Pytest plugin of each selfcheck child process (``-p harness.selfcheck.plugin``).

Runs the tests named in ``HARNESS_RUN_FIRST`` first, and exits at once after the first failure with
``HARNESS_EXIT_ON_FIRST_FAILURE=1`` (mutant runs), once the report log has its line; the results are read
from that log (:mod:`harness.plugin.child_runs`)."""

from __future__ import annotations

import os

import pytest


@pytest.hookimpl(trylast=True)  # after the harness plugin's order: the hinted test runs first whatever it is
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first = [line for line in os.environ.get("HARNESS_RUN_FIRST", "").splitlines() if line]
    if not first:
        return
    rank = {nodeid: position for position, nodeid in enumerate(first)}
    # A stable sort: hinted tests first in hint order, the rest of the suite in its own order.
    items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))


@pytest.hookimpl(trylast=True)  # after pytest-reportlog has written the report
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed and os.environ.get("HARNESS_EXIT_ON_FIRST_FAILURE") == "1":
        os._exit(1)
