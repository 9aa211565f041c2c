"""This checkout's own pytest settings, for its runs alone (the harness's plugin is an entry point, not named here:
an engine collecting a suite of an editable checkout may load this file, where ``pytest_plugins`` is refused).

``HARNESS_FAILURE_LOG=PATH`` appends each failure's report to PATH the moment it arrives (in the pytest-xdist
controller too), so a run stopped at its time limit, which never prints its summary, still leaves every failure it
had seen (the GPU check sets it for its steps).
"""

from __future__ import annotations

import os

import pytest

# Not test folders of this checkout: virtual environments, build output and the example engine package.
collect_ignore_glob = [".venv*", ".ci", "build", "docs"]

_failure_log: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _failure_log
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) writes; workers report to it
        # taken out of the environment: child pytest runs (whose failures are often the point of a test) log nothing
        _failure_log = os.environ.pop("HARNESS_FAILURE_LOG", None) or None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _failure_log and report.failed:
        with open(_failure_log, "a") as log:
            log.write(f"{'=' * 30} {report.nodeid} ({report.when}) {'=' * 30}\n{report.longreprtext}\n\n")
