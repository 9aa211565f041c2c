"""Pytest plugin of each selfcheck child process (``-p harness.selfcheck.plugin``).

Runs the tests named in ``HARNESS_RUN_FIRST`` first, writes the first failure to ``HARNESS_FIRST_FAILURE``,
exits at once after it with ``HARNESS_EXIT_ON_FIRST_FAILURE=1`` (mutant runs), and writes the slowest
tests to ``HARNESS_SLOWEST_TESTS`` (reference runs)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest


@pytest.hookimpl(trylast=True)  # after the harness plugin's order: the hinted test runs first whatever it is
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first = [line for line in os.environ.get("HARNESS_RUN_FIRST", "").splitlines() if line]
    if not first:
        return
    rank = {nodeid: position for position, nodeid in enumerate(first)}
    # A stable sort: hinted tests first in hint order, the rest of the suite in its own order.
    items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))


_recorded = False
SLOWEST_COUNT = 10
_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    global _recorded
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration
    target = os.environ.get("HARNESS_FIRST_FAILURE")
    if _recorded or not target or not report.failed:
        return
    _recorded = True
    started = float(os.environ.get("HARNESS_STARTED_AT", "0") or 0)
    record: dict[str, Any] = {"nodeid": report.nodeid, "when": report.when,
                              "seconds": round(time.time() - started, 2) if started else None}
    with open(target, "w") as handle:
        json.dump(record, handle)
    if os.environ.get("HARNESS_EXIT_ON_FIRST_FAILURE") == "1":
        os._exit(1)


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("HARNESS_SLOWEST_TESTS")
    # Under xdist the controller receives every worker's reports; a worker writes nothing.
    if not target or hasattr(session.config, "workerinput"):
        return
    slowest = sorted(_seconds.items(), key=lambda entry: -entry[1])[:SLOWEST_COUNT]
    with open(target, "w") as handle:
        json.dump([[nodeid, round(seconds, 2)] for nodeid, seconds in slowest], handle)
