"""What a failed test's report adds: the command that reproduces it, and how to update a golden."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import locations
from harness.devices import EXPERTS_IMPLEMENTATIONS, experts_implementation
from harness.plugin.child_runs import absolute_pythonpath
from harness.plugin.session import SESSION_KEY, session_of

__all__ = ["annotate_failure", "failure_context", "file_node_id", "reproduce_command"]


def reproduce_command(config: pytest.Config, nodeid: str, *, replay: tuple[str, str] | None = None,
                      seed: str | None = None) -> str:
    """The command line that reruns test ``nodeid`` as this session ran it, from any directory.

    It starts with ``PYTHONPATH=...`` when that is set (each entry absolute, see :func:`absolute_pythonpath`)
    and this session's interpreter (``python -m pytest``), names the test by absolute path, with ``--rootdir``
    for a test of a checkout (so the root conftest and the pytest options of the project apply wherever it is
    run; not for an installed wheel's suites, whose line keeps pytest's cache off instead), the device, backend and
    implementations, the hypothesis profile, the engine's own golden folder (``--golden-dir``, absolute, also where
    the ini named it), and, for a hypothesis failure, ``--reproduce-failure VERSION:BLOB`` (replays the falsifying
    example without the local example database, no search, no shrinking) or the ``--hypothesis-seed`` that found
    it. ``nodeid`` may start with the test file's absolute path (see
    :func:`file_node_id`).
    """
    from harness.plugin.profiles import current_hypothesis_profile, given_replay

    session = session_of(config)
    root = config.rootpath
    path, sep, rest = nodeid.partition("::")
    # The interpreter that ran this session (its environment has the harness and the implementations),
    # and PYTHONPATH, through which an outside --impl module may have been found, its entries absolute:
    # pasteable in a new shell in any folder.
    start = config.invocation_params.dir
    prefix = [f"PYTHONPATH={absolute_pythonpath(session.pythonpath, start)}"] if session.pythonpath else []
    parts = [sys.executable, "-m", "pytest", f"{root / path}{sep}{rest}"]
    # --rootdir brings a checkout's conftest and settings to its tests; an installed wheel's suite file, named by
    # its absolute path, needs none, and this run's rootdir (the folder it started in) may not exist where the
    # line is pasted
    if locations.is_checkout():
        parts += ["--rootdir", str(root)]
    else:
        # pytest then takes the rootdir from the suite file and the folder the line is pasted in: where their only
        # common folder is /, the suite's own folder, inside the installed package, which its cache must not go into
        parts += ["-p", "no:cacheprovider"]
    parts += ["--device", session.device.type, "--graph-backend", session.backend.name]
    for component, spec in session.impl_specs.items():
        parts += ["--impl", f"{component}={spec}"]
    if config.getoption("--tp", 2) != 2:
        parts += ["--tp", str(config.getoption("--tp"))]
    if session.golden_dir is not None:  # the ini that may have named it is not read from another folder
        parts += [f"--golden-dir={session.golden_dir}"]  # joined: see child_runs.pytest_command
    parts += ["--hypothesis-profile", current_hypothesis_profile()]
    if config.getoption("--hazard-amplifiers", "on") != "on":
        parts += ["--hazard-amplifiers", config.getoption("--hazard-amplifiers")]
    if experts_implementation() != EXPERTS_IMPLEMENTATIONS[0]:
        parts += ["--experts-implementation", experts_implementation()]
    seed = seed if seed is not None else config.getoption("hypothesis_seed", None)
    if seed is not None:
        parts += ["--hypothesis-seed", str(seed)]
    replay = replay or given_replay(config)
    if replay is not None:
        parts += ["--reproduce-failure", f"{replay[0]}:{replay[1]}"]
    return " ".join([*map(shlex.quote, prefix), shlex.join(parts)])


def failure_context(request: pytest.FixtureRequest, /, **details: Any) -> dict[str, Any]:
    """Context for :func:`harness.compare.assert_equivalent` failure messages: implementations,
    backend and ``details`` (seed, shapes, ...); the report adds the command that reproduces it."""
    session = session_of(request.config)
    context: dict[str, Any] = {
        "implementations": dict(session.impl_specs) or "reference",
        "backend": session.backend.name,
    }
    context.update(details)
    # No command here: it is written once, complete, in the "reproduce" section that annotate_failure
    # adds to every failed test's report, where hypothesis's falsifying example is known.
    return context


_BLOB = re.compile(r"@reproduce_failure\('(?P<version>[^']+)', b'(?P<blob>[^']+)'\)")
_SEED = re.compile(r"--hypothesis-seed=(?P<seed>-?\d+)")


def _snapshot_executions(item: pytest.Item) -> Any:
    """syrupy's record of the test's snapshot assertions (index -> result), or None where it has none."""
    return getattr(getattr(item, "funcargs", {}).get("snapshot"), "executions", None)


def _is_golden_mismatch(item: pytest.Item, report: pytest.TestReport) -> bool:
    """Whether a golden assertion of the test failed (a mismatch or a missing snapshot).

    Asked of syrupy's record of the test's snapshot assertions; the crash message is only a fallback,
    since its form depends on the verbosity (``assert [+ received] == [- snapshot]`` at ``-vv``,
    ``AssertionError: assert ...`` below it)."""
    executions = _snapshot_executions(item)
    if isinstance(executions, dict) and executions:
        return any(not getattr(result, "success", True) for result in executions.values())
    crash = getattr(report.longrepr, "reprcrash", None)
    message = (getattr(crash, "message", "") or "").removeprefix("AssertionError: ")
    return message.startswith("assert") and re.search(r"\bsnapshot\b", message, re.IGNORECASE) is not None


def _shown(path: Path, config: pytest.Config) -> str:
    """``path`` as a user types it where pytest ran: relative below the invocation folder, else absolute."""
    start = Path(config.invocation_params.dir).resolve()
    path = path.resolve()
    return os.path.relpath(path, start) if path.is_relative_to(start) else str(path)


def _golden_hint(item: pytest.Item, update: str) -> str:
    """How to act on a failed golden, naming the folder that holds it: the engine's own (``--golden-dir``),
    a checkout's ``golden/``, or an installed harness's, which ``--snapshot-update`` does not write."""
    from harness.golden import golden_root

    folder = golden_root(item.path)
    shown = _shown(folder, item.config) + "/"
    executions = _snapshot_executions(item)
    failed = [result for result in (executions.values() if isinstance(executions, dict) else ())
              if not getattr(result, "success", True) and getattr(result, "snapshot_location", None)]
    files = [Path(result.snapshot_location) for result in failed]
    named = ", ".join(_shown(path, item.config) for path in files) or f"its golden file under {shown}"
    session = session_of(item.config)
    packaged = (session.golden_dir is None and not locations.is_checkout()
                and folder.resolve().is_relative_to(locations.project_root()))
    if packaged:
        return (f"the output does not match {named}, a golden of the installed harness, which --snapshot-update "
                "does not rewrite. If your implementation differs from the reference where the contract leaves it "
                "open, keep goldens of your own: record them with\n"
                f"  {update} --snapshot-update --golden-dir=PATH\n"
                "then review and commit PATH, and run with --golden-dir=PATH (or harness_golden_dir = PATH in your "
                "pytest ini); if not, the implementation changed behaviour.")
    if files and not any(path.is_file() for path in files):
        return (f"no golden {named} in {shown}. Record it with\n  {update} --snapshot-update\n"
                f"then review `git status {shown}` and commit the golden with the change.")
    return (f"the output does not match {named} (goldens in {shown}). If the change is intended, rewrite the "
            f"golden with\n  {update} --snapshot-update\n"
            f"then review `git diff {shown}` and commit the golden with the change; "
            "if not, the implementation changed behaviour.")


def file_node_id(item: pytest.Item) -> str:
    """The item's node id anchored at its file: the id relative to the rootdir where the file lies in it,
    else the file's absolute path and the names inside it (an installed wheel's suites are outside the
    rootdir, and their node ids relative to the folder they were collected from)."""
    module = item.getparent(pytest.Module)
    if module is None or item.path.resolve().is_relative_to(item.config.rootpath.resolve()):
        return item.nodeid
    return f"{item.path}::{item.nodeid[len(module.nodeid):].lstrip(':')}"


def annotate_failure(item: pytest.Item, report: pytest.TestReport) -> None:
    """Add to a failed test's report the line that reproduces it and, for a golden, how to update it.

    Called from ``pytest_runtest_makereport`` once the report exists, so hypothesis's falsifying
    example (printed as ``@reproduce_failure`` with ``print_blob``) is known.
    """
    if not report.failed or SESSION_KEY not in item.config.stash:
        return
    text = str(report.longrepr)
    blob, seed = _BLOB.search(text), _SEED.search(text)
    nodeid = file_node_id(item)
    command = reproduce_command(item.config, nodeid, seed=seed["seed"] if seed else None,
                                replay=(blob["version"], blob["blob"]) if blob else None)
    sections = [("reproduce", command)]
    if report.when == "call" and "snapshot" in getattr(item, "fixturenames", ()) and _is_golden_mismatch(item, report):
        update = reproduce_command(item.config, nodeid)
        sections.append(("golden", _golden_hint(item, update)))
    for title, content in sections:
        if hasattr(report.longrepr, "addsection"):
            report.longrepr.addsection(title, content)
        else:
            report.sections.append((title, content))
