"""Child pytest runs of selfcheck and conformance: the command (an argv list, which the fork server runs
too), the run in its own process session under a time limit, and the per-test results read back from
its pytest-reportlog file (``--report-log``), to which the runs' plugins add user properties."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness import locations

__all__ = ["ChildRun", "HYPOTHESIS_STORAGE", "absolute_pythonpath", "child_environment", "pytest_command", "run",
           "stop", "lower_priority", "read_report_log", "phase_reports", "failed_nodeids", "why_it_did_not_run"]


@dataclasses.dataclass(frozen=True)
class ChildRun:
    returncode: int | None  # None: stopped at the time limit
    output: str  # stdout and stderr, interleaved
    seconds: float


def absolute_pythonpath(value: str, start: str | Path) -> str:
    """``PYTHONPATH`` as this interpreter read it, every entry absolute: a relative entry (``.``, ``src``) and an
    empty one (the current folder, to Python) are taken from ``start``, the folder the run was started in, so
    that a line carrying it finds the same modules when pasted in another folder."""
    return os.pathsep.join(os.path.normpath(os.path.join(start, entry)) for entry in value.split(os.pathsep))


# hypothesis's own variable naming the folder of its storage (example database, constants cache); unset, it is
# ``.hypothesis`` in the current folder.
HYPOTHESIS_STORAGE = "HYPOTHESIS_STORAGE_DIRECTORY"


def child_environment() -> dict[str, str]:
    """This process's environment for a child started in another folder (the suites' root, an installed package
    from a wheel): ``PYTHONPATH`` with every entry absolute, so the child finds the modules this process was pointed
    at, and :data:`HYPOTHESIS_STORAGE` absolute: the caller's own where set, else ``.hypothesis`` in
    :func:`harness.locations.state_dir`, so that nothing is written into the suites' root."""
    environment = dict(os.environ)
    if environment.get("PYTHONPATH"):
        environment["PYTHONPATH"] = absolute_pythonpath(environment["PYTHONPATH"], Path.cwd())
    storage = environment.get(HYPOTHESIS_STORAGE) or locations.state_dir() / ".hypothesis"
    environment[HYPOTHESIS_STORAGE] = str(Path.cwd() / storage)
    return environment


def pytest_command(paths: Iterable[str | Path], *, root: Path, plugin: str, report_log: Path,
                   arguments: Iterable[str] = ()) -> list[str]:
    """``python -m pytest PATHS`` with ``plugin`` loaded and its reports logged to ``report_log``; node ids
    relative to ``root`` (``--rootdir``: in an installed wheel too, which has no ini file).

    Every option value is joined to its option (``--report-log=PATH``): pytest finds the ini file before it
    loads plugins, so the value of a plugin's option written as a separate word counts as a test path there,
    and an existing file outside ``root`` (the report log, once the controller has made it, when an xdist
    worker starts) moves the search to a folder above the project's ini; with ``--rootdir`` given, pytest does
    not search again from the test paths, so the ini is not read. ``arguments`` should be written the same way."""
    return [sys.executable, "-m", "pytest", *(str(path) for path in paths), f"--rootdir={root}", "-q", "-rfE",
            "-p", "no:cacheprovider", "-p", plugin,
            # by its entry point's name: loaded once where plugins autoload, and where they do not
            "-p", "pytest_reportlog", f"--report-log={report_log}", *arguments]


def why_it_did_not_run(output: str, *, last: int) -> list[str]:
    """The lines of a child's ``output`` that say why it ran no test: its first error line, which is often far above
    the end (an xdist worker's usage error, then "no tests ran"), and its ``last`` non-blank lines."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    tail = lines[-last:]
    cause = next((line for line in lines if re.search(r"\berror: ", line, re.IGNORECASE)), None)
    return ([cause] if cause and cause not in tail else []) + tail or ["(no output)"]


def lower_priority(pid: int, niceness: int) -> None:
    """Add ``niceness`` to the nice value of the just-started process ``pid``, which its later threads,
    forks and children inherit; where the platform cannot, or the process is gone, it runs as it is."""
    if niceness <= 0 or not hasattr(os, "setpriority"):
        return
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, pid) + niceness))


def run(command: list[str], *, cwd: Path, environment: dict[str, str], time_limit: float | None,
        niceness: int = 0) -> ChildRun:
    """Run ``command`` in its own process session and wait for it, at most ``time_limit`` seconds (None:
    no limit); past it, stop it and everything it started (exit status None)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    lower_priority(process.pid, niceness)
    try:
        output, _ = process.communicate(timeout=time_limit)
        returncode: int | None = process.returncode
    except subprocess.TimeoutExpired:
        stop(process)
        output, _ = process.communicate()
        returncode = None
    return ChildRun(returncode, output, time.perf_counter() - started)


def stop(process: subprocess.Popen) -> None:
    """Stop a child started in its own session, with everything it started (pytest-xdist workers)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (AttributeError, ProcessLookupError, PermissionError):  # no process groups here, or already gone
        process.kill()


def read_report_log(path: Path) -> list[dict[str, Any]]:
    """The entries of a report log, in the order written; none where the child wrote no log. A line cut
    short (the child stopped while writing it) ends the list."""
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            break
    return entries


def phase_reports(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The test phases' reports of a report log (setup, call and teardown of each test that ran)."""
    return [entry for entry in entries if entry.get("$report_type") == "TestReport"]


def failed_nodeids(entries: Iterable[dict[str, Any]]) -> list[str]:
    """The node ids of the failed tests and collectors of a report log, first failure first, once each."""
    return list(dict.fromkeys(entry["nodeid"] for entry in entries
                              if entry.get("$report_type") in ("TestReport", "CollectReport")
                              and entry.get("outcome") == "failed"))
