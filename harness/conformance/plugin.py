"""Pytest plugin of the ``python -m harness conformance`` child process (``-p harness.conformance.plugin``).

Gives each test its nearest ``clause`` marker, each failed or skipped phase its failure details or reason,
and each phase the documented-away clauses an engine adapter said the test stepped outside of and the
stand-ins it reached (:func:`harness.conformance.clauses.outside_contract`, ``rests_on_stand_in``), as user
properties, which reach the run's report log (:mod:`harness.plugin.child_runs`); appends one JSON line per
collected test to the file named by ``HARNESS_CONFORMANCE_RECORD`` (a report log has no line for a test that
never ran). It also tells :class:`PerTestInConformance` which test runs, reverses the tests' order where
``HARNESS_CONFORMANCE_ORDER`` asks, and measures the implementation's reach (:mod:`harness.conformance.reach`)."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Generator
from typing import Any

import pytest

from harness.conformance import reach
from harness.conformance.clauses import MARKER, running_test_notes
from harness.errors import MismatchError
from harness.oracle import _recording

_RECORD = "HARNESS_CONFORMANCE_RECORD"
#: ``reversed`` runs the collected tests in reverse order (a second recording that proves the verdicts order-free).
ORDER_VARIABLE = "HARNESS_CONFORMANCE_ORDER"
_RECORDING = pytest.StashKey[Any]()
# The node id of the test running in this process, kept only where this plugin is loaded (a conformance run).
_RUNNING: list[str | None] = [None]


class PerTestInConformance:
    """What a suite builds once and shares between its tests (a captured runner and its model), by key. Shared for
    the whole run, except in a conformance run: there each test gets its own, so that no verdict depends on which
    tests its process ran before it (a finding that only a runner's first call shows would otherwise fail only the
    first test to use it)."""

    def __init__(self) -> None:
        self._entries: dict[Any, Any] = {}
        self._owner: str | None = None

    def get(self, key: Any, build: Callable[[], Any]) -> Any:
        if _RUNNING[0] != self._owner:
            self._entries.clear()
            self._owner = _RUNNING[0]
        if key not in self._entries:
            self._entries[key] = build()
        return self._entries[key]


# Where hypothesis's falsifying example starts in a failure (the wording moved between versions),
# and where its own advice after the example starts.
_EXAMPLE_START = re.compile(r"^(?:Falsifying (?:explicit )?example:|Failing test case:|state = )", re.MULTILINE)
_EXAMPLE_END = re.compile(r"^(?:Explanation:|You can reproduce|@reproduce_failure|Trying example:)", re.MULTILINE)
_REPRODUCE = re.compile(r"^-+ reproduce -+\n(.+)$", re.MULTILINE)


def clause_of(item: pytest.Item) -> str | None:
    """The clause ``item`` checks: a parameter's marker first, then the nearest (test, class, module)."""
    for mark in getattr(getattr(item, "callspec", None), "marks", None) or ():
        if mark.name == MARKER and mark.args:
            return str(mark.args[0])
    marker = item.get_closest_marker(MARKER)
    return str(marker.args[0]) if marker is not None and marker.args else None


def _append(record: dict[str, Any]) -> None:
    target = os.environ.get(_RECORD)
    if target:
        with open(target, "a") as handle:  # one short line per write: appends from xdist workers do not interleave
            handle.write(json.dumps(record) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    reach.start_measuring()  # where the parent asked for it: this process's reach of the implementation's modules
    recording = _recording.recording()
    recording.__enter__()  # a failed check is recorded and the test goes on (harness.oracle._recording)
    config.stash[_RECORDING] = recording


def pytest_unconfigure(config: pytest.Config) -> None:
    reach.stop_measuring()
    recording = config.stash.get(_RECORDING, None)
    if recording is not None:
        recording.__exit__(None, None, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Fail a test with every check it recorded outside a hypothesis example (those inside fail their example), also
    where it went on to fail or skip for another reason after them (that reason is chained)."""
    __tracebackhide__ = True
    try:
        result = yield
    except BaseException as error:
        recorded = _recording.take_recorded()
        if not recorded:
            raise
        if isinstance(error, MismatchError):
            raise _recording.combined([*recorded, error]) from None
        raise _recording.combined(recorded) from error
    recorded = _recording.take_recorded()
    if recorded:
        raise _recording.combined(recorded)
    return result


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(ORDER_VARIABLE) == "reversed":  # every xdist worker collects the same reversed list
        items.reverse()
    for item in items:
        clause = clause_of(item)
        item.user_properties.append(("clause", clause))
        _append({"collected": item.nodeid, "clause": clause})


def failure_details(report: pytest.TestReport) -> dict[str, str]:
    """The crash message, hypothesis's falsifying example and the reproduce command of a failed report."""
    text = report.longreprtext or ""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None) or (text.strip().splitlines() or [""])[-1]
    example = ""
    start = _EXAMPLE_START.search(message)
    if start is not None:
        message, rest = message[:start.start()], message[start.start():]
        end = _EXAMPLE_END.search(rest)
        example = (rest[:end.start()] if end else rest).strip()
    message = message.strip()
    if crash is not None and re.fullmatch(r"[\w.]+", message):  # a bare exception (SGLang's plain asserts)
        message += f" (raised at {_short_path(str(crash.path))}:{crash.lineno})"
    reproduce = _REPRODUCE.search(text)
    return {"message": message, "example": example,
            "reproduce": reproduce.group(1).strip() if reproduce else ""}


def _short_path(path: str) -> str:
    """``path`` from the package root it was imported from (the longest ``sys.path`` entry above it), so that an
    exception raised in an engine's module names the module's file, not the machine's folders."""
    roots = [root for root in map(os.path.abspath, filter(None, sys.path))
             if os.path.abspath(path).startswith(root + os.sep)]
    return os.path.relpath(path, max(roots, key=len)) if roots else path


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    running_test_notes(clear=True)  # what adapters and stand-ins say of this test, not of the one before
    _recording.take_recorded()  # what its fixtures record is this test's; what an earlier test left is not
    _RUNNING[0] = nodeid


# Outermost (tryfirst): its part after the yield runs after the harness plugin's, which adds the reproduce line.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    # the documented-away clauses this test stepped outside of so far, the stand-ins it reached
    report.user_properties.extend(running_test_notes().items())
    if report.failed:
        report.user_properties.extend(failure_details(report).items())
    elif report.skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr
        report.user_properties.append(("reason", str(reason)))
    return report
