"""The run report: what ran, what passed per component, how close results came to their tolerances.

Printed at the end of an active run, written as JSON with ``--harness-report=PATH``, merged across
pytest-xdist workers; :func:`format_markdown` renders it (and a kill matrix) for a CI step summary."""

from __future__ import annotations

import collections
import dataclasses
import importlib
import json
import os
import re
import types
from pathlib import Path
from typing import Any

import pytest

from harness import observations

__all__ = ["RunReport", "format_text", "format_markdown", "annotations", "write_step_summary"]

_WORKER_KEY = "harness_report"
_DRIFT_FIELDS = ("golden", "where", "device_class", "kind", "differences", "record")
_CONSTRAINTS = "constraints.txt"  # a checkout's pins, beside pyproject.toml
_SHOWN_DIFFERENCES = 20  # per drifted record in the terminal; the JSON report keeps them all


def _golden() -> Any:
    # torch and syrupy load with the report's first use in an active run, not with the plugin. The module in
    # sys.modules, the one the snapshot fixture's extension uses (not a stale attribute of the harness package
    # after pytester's in-process runs restored sys.modules).
    return importlib.import_module("harness.golden")


def _torch() -> Any:
    import torch

    return torch


def pytest_addoption(parser: pytest.Parser) -> None:
    from harness.plugin.options import add_harness_option

    add_harness_option(
        parser, "--harness-report", metavar="PATH", default=None,
        help="also write the run report (setup, outcomes per component, errors per dtype, goldens) as JSON")


@pytest.hookimpl(trylast=True)  # after the harness plugin has resolved the device, where asked at start-up
def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(RunReport(config), "harness-run-report")


def _component(nodeid: str) -> str:
    """The folder under ``suites/`` of a node id or a test's location (an installed wheel's suites lie
    outside the rootdir: their location, ``../site-packages/harness/suites/gather/...``, still names it)."""
    parts = nodeid.split("::")[0].split("/")
    if "suites" in parts[:-1]:
        return parts[parts.index("suites") + 1] if parts.index("suites") + 2 < len(parts) else "suites"
    return parts[0] if len(parts) > 1 else "(root)"


def _harness_session(config: pytest.Config) -> Any:
    """What the harness plugin resolved (device, backend, implementations), or None where it is not active."""
    from harness.plugin import session

    return session.current_session(config)


def _setup(config: pytest.Config) -> dict[str, Any]:
    session = _harness_session(config)
    device = getattr(session, "device", None)
    # Versions read without importing (transformers' import costs about a second of every run whose suites need
    # no model); transformers is optional for the graphs and gather suites.
    upstream = _upstream_versions()
    return {
        "device": str(device) if device is not None else "unknown",
        "device_class": _golden().device_class(device) if device is not None else "unknown",
        "graph_backend": getattr(getattr(session, "backend", None), "name", "unknown"),
        "torch": _torch().__version__,
        "transformers": upstream["transformers"],
        "implementations": dict(getattr(session, "impl_specs", {}) or {}) or "reference",
        "hypothesis_profile": _hypothesis_profile(),
        "upstream": upstream,
    }


def _upstream_versions() -> dict[str, str]:
    """The installed version of each library whose releases can move the harness's verdicts, read from its
    metadata (as pip names it), so the drift job's summary can set them beside the pins."""
    from harness.upstream import UPSTREAM_PACKAGES, installed_version_text

    return {name: installed_version_text(name) or "not installed" for name in UPSTREAM_PACKAGES}


def _hypothesis_profile() -> str:
    from harness.plugin.profiles import current_hypothesis_profile

    return current_hypothesis_profile()


class RunReport:
    """Collects the report's parts in each pytest process; the controller (or the only process) reports.

    Registered in every run, it only counts until the harness is active in its process (:meth:`_start`);
    a controller of xdist workers that activated it during their collection reports what they send."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.is_worker = hasattr(config, "workerinput")
        self.outcomes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.failed: set[str] = set()  # node ids of failed tests and errors (setup, teardown, collection)
        self.collected: dict[str, list[str]] = {}
        self.parts: list[dict[str, Any]] = []  # from xdist workers
        self.orphans: list[str] = []
        self.deleted: list[str] = []
        self.report: dict[str, Any] | None = None
        self.started = False
        self._start()

    def _start(self) -> bool:
        """Whether the harness is active in this process; the first time it is, set the goldens' device
        class and update mode and forget earlier observations (a previous in-process run's)."""
        if not self.started and _harness_session(self.config) is not None:
            device = _harness_session(self.config).device
            golden = _golden()
            from harness.plugin.failures import reproduce_command

            golden.configure_goldens(device_class=golden.device_class(device),
                                     update=bool(self.config.getoption("--snapshot-update", False)),
                                     golden_dir=_harness_session(self.config).golden_dir,
                                     rerun=lambda nodeid: reproduce_command(self.config, nodeid))
            observations.reset()
            self.started = True
        return self.started

    # --- goldens nobody owns -------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)  # before -k / -m deselection: a deselected test still owns its goldens
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        root = self.config.rootpath
        for item in items:
            module, _, name = item.nodeid.partition("::")
            if (root / module).is_file():
                self.collected.setdefault(module, []).append(name.replace("::", "."))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not self._start() or (self.is_worker and self.config.workerinput.get("workerid") != "gw0"):
            return  # every worker collects the same tests; one of them checks
        root = self.config.rootpath
        scopes = []
        for argument in self.config.args:
            path, _, node = str(argument).partition("::")
            resolved = (Path(self.config.invocation_params.dir) / path).resolve()
            if node or not resolved.exists() or not resolved.is_relative_to(root):
                continue  # a single test given by id: its module's other goldens are not in question
            scopes.append(resolved.relative_to(root).as_posix() or ".")
        if "." in scopes:
            scopes = ["suites"]
        orphans = _golden().find_orphans(root=root, collected=self.collected, scopes=scopes,
                                         golden_dir=_harness_session(self.config).golden_dir)
        names = [path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path) for path in orphans]
        if self.config.getoption("--snapshot-update", False):
            for path in orphans:
                path.unlink()
            self.deleted = names
        else:
            self.orphans = names

    # --- outcomes per component ----------------------------------------------------------------
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or report.outcome != "passed":
            outcome = "error" if report.when != "call" and report.outcome == "failed" else report.outcome
            where = report.location[0] if getattr(report, "location", None) else report.nodeid
            self.outcomes[_component(where)][outcome] += 1
            if report.failed:
                self.failed.add(report.nodeid)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.outcomes[_component(report.nodeid)]["error"] += 1
            self.failed.add(report.nodeid)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        text = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
        if text:
            self.parts.append(json.loads(text))
            if not self.started:
                # workers that activated the harness during their collection: this controller's syrupy
                # reports on their goldens when the session ends, by the harness's rule too
                from harness.plugin.session import use_harness_orphan_rule

                use_harness_orphan_rule(self.config)

    # --- the report ----------------------------------------------------------------------------
    def _local_part(self) -> dict[str, Any]:
        return {
            "setup": _setup(self.config),
            **observations.snapshot(),
            "drift": [dataclasses.asdict(event) for event in _golden().drift_events()],
            "orphans": self.orphans,
            "deleted": self.deleted,
        }

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not (self._start() or self.parts):
            return  # the harness never ran here: an unrelated run
        if self.is_worker:
            self.config.workeroutput[_WORKER_KEY] = json.dumps(self._local_part())
            return
        # A controller that did not activate the harness itself reports the setup its workers resolved.
        setup = _setup(self.config) if self.started else self.parts[0]["setup"]
        parts = [self._local_part(), *self.parts]
        tallies = observations.merge(parts)
        from harness.compare import tolerance_for

        errors = {}
        for dtype_name, entry in sorted(tallies["errors"].items()):
            tol = tolerance_for(getattr(_torch(), dtype_name))
            errors[dtype_name] = {**entry, "rtol": tol.rtol, "atol": tol.atol}
        root = self.config.rootpath

        def relative(location: str) -> str:
            path = Path(location)
            return path.relative_to(root).as_posix() if path.is_absolute() and path.is_relative_to(root) else location

        drift = sorted({(relative(e["golden"]), e["where"], e["device_class"], e["kind"],
                         tuple(e.get("differences", ())), e.get("record", ""))
                        for part in parts for e in part["drift"]})
        orphans = sorted({name for part in parts for name in part["orphans"]})
        if orphans and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self.report = {
            "setup": setup,
            "outcomes": {component: dict(counts) for component, counts in sorted(self.outcomes.items())},
            "failed": sorted(self.failed),
            "errors": errors,
            "counters": dict(sorted(tallies["counters"].items())),
            "goldens": {
                "drift": [dict(zip(_DRIFT_FIELDS, (*row[:4], list(row[4]), row[5]))) for row in drift],
                "orphans": orphans,
                "deleted": sorted({name for part in parts for name in part["deleted"]}),
            },
            "exit_status": int(session.exitstatus),
            "pins": _pins(self.config.rootpath),
        }
        path = self.config.getoption("--harness-report")
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(self.report, indent=2) + "\n")

    @pytest.hookimpl(tryfirst=True)  # before syrupy's summary, whose banner it drops
    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int) -> None:
        if self.report is None:
            return  # the harness did not run
        _drop_syrupy_banner(self.config)
        if exitstatus == pytest.ExitCode.USAGE_ERROR:
            return  # a bad path or option: pytest's one error line is the whole story
        terminalreporter.write_sep("=", "harness run report")
        for line in format_text(self.report).splitlines():
            terminalreporter.write_line(line)
        orphans = self.report["goldens"]["orphans"]
        if orphans:
            terminalreporter.write_line(
                "orphaned goldens fail the run: delete them, or rerun with --snapshot-update", red=True)
            # pytest's last line counts every category of its stats: it then names the orphans beside the passes
            terminalreporter.stats.setdefault("orphaned goldens", []).extend(
                types.SimpleNamespace(golden=name) for name in orphans)
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            terminalreporter.write_line("interrupted: the run stopped before its end; these counts cover only the "
                                        "tests that finished", red=True)


class _WithoutBanner:
    """syrupy's session report without what its unused-snapshot rule says: the harness switches that rule
    off on purpose (its own orphan rule replaces it; README's *Goldens*), so syrupy 6 and newer print a
    banner saying it is off. syrupy 5 cannot switch it off: it counts the goldens of other devices and
    torch versions as unused and advises ``--snapshot-update`` to delete them, which the harness refuses
    under syrupy 5. Both are dropped; the harness's own orphan line says what is truly unused."""

    def __init__(self, report: Any) -> None:
        self._report = report

    def __getattr__(self, name: str) -> Any:
        return getattr(self._report, name)

    @property
    def lines(self) -> Any:
        kept: list[str] = []
        for line in self._report.lines:
            if "--snapshot-disable-unused" in line or _UNUSED_DETAIL.match(line):
                continue
            if "to delete unused snapshots" in line:
                if kept and not kept[-1].strip():
                    kept.pop()  # syrupy's blank line before its unused block
                continue
            shortened = _UNUSED_COUNT.sub("", line)
            if shortened.strip() or not line.strip():
                kept.append(shortened)
        return iter(kept)


# syrupy 5's words, possibly coloured: " 2 snapshots unused." in its summary line, "Unused name (path)" with details.
_STYLE = r"(?:\x1b\[[0-9;]*m)*"
_UNUSED_COUNT = re.compile(rf" ?{_STYLE}\d+{_STYLE} snapshots? unused\.")
_UNUSED_DETAIL = re.compile(rf"{_STYLE}Unused{_STYLE} ")


def _drop_syrupy_banner(config: pytest.Config) -> None:
    session = getattr(config, "_syrupy", None)  # syrupy's session (private; absent under -p no:syrupy)
    report = getattr(session, "report", None)
    if report is not None and not isinstance(report, _WithoutBanner):
        session.report = _WithoutBanner(report)


def _outcome_cells(counts: dict[str, int]) -> str:
    return ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped") if counts.get(k))


def _pins(root: Path) -> dict[str, str]:
    """The pins of the checkout's ``constraints.txt`` (the versions its goldens were recorded with); none where the
    run's rootdir has no such file (an engine's repository)."""
    from harness.upstream import read_pins

    path = root / _CONSTRAINTS
    return read_pins(path) if path.is_file() else {}


def _moved(version: str, pinned: str) -> str:
    """How an installed version stands to its pin: "" (the pin), "newer", "older", or "different" (another
    spelling of the same release, or one that is not numbers)."""
    from harness.upstream import parse_version

    if version == pinned:
        return ""
    now, then = parse_version(version), parse_version(pinned)
    if now is None or then is None or now == then:
        return "different"
    return "newer" if now > then else "older"


def _moved_from_pins(report: dict[str, Any]) -> list[str]:
    pins = report.get("pins") or {}
    return [f"{name} {version} (pinned {pins[name]})" for name, version in report["setup"].get("upstream", {}).items()
            if name in pins and _moved(version, pins[name])]


def format_text(report: dict[str, Any]) -> str:
    """The report as the terminal shows it."""
    setup = report["setup"]
    lines = [f"device {setup['device']} ({setup['device_class']}), graph backend {setup['graph_backend']}, "
             f"torch {setup['torch']}, transformers {setup['transformers']}, "
             f"implementations {setup['implementations']}, hypothesis profile {setup.get('hypothesis_profile', '?')}"]
    moved = _moved_from_pins(report)
    if moved:
        lines.append(f"  upstream drift: {', '.join(moved)} in {_CONSTRAINTS}; records are compared by release "
                     "(README, Upstream versions)")
    for component, counts in report["outcomes"].items():
        lines.append(f"  {component:<12} {_outcome_cells(counts) or 'nothing ran'}")
    for dtype_name, entry in report["errors"].items():
        lines.append(f"  largest {dtype_name} error {entry['max_abs_error']:.3g} "
                     f"({100 * entry['tolerance_used']:.1f}% of rtol={entry['rtol']:g}, atol={entry['atol']:g}; "
                     f"{entry['comparisons']} comparisons)")
    if report["counters"]:
        lines.append("  counters: " + ", ".join(f"{k}={v}" for k, v in report["counters"].items()))
    goldens = report["goldens"]
    for event in goldens["drift"]:
        lines.append(f"  golden {event['golden']} {event['where']}: {event['kind']} ({event['device_class']})")
        differences = event.get("differences", [])
        lines += [f"      {line}" for line in differences[:_SHOWN_DIFFERENCES]]
        if len(differences) > _SHOWN_DIFFERENCES:
            more = len(differences) - _SHOWN_DIFFERENCES
            lines.append(f"      ... and {more} more (--harness-report=PATH keeps all)")
        if event.get("record"):
            lines.append(f"      record it: {event['record']}")
    for name in goldens["orphans"]:
        lines.append(f"  ORPHANED golden {name}: no test owns it")
    for name in goldens["deleted"]:
        lines.append(f"  deleted orphaned golden {name}")
    return "\n".join(lines)


def format_markdown(report: dict[str, Any] | None = None, kill_matrix: list[dict[str, Any]] | None = None, *,
                    pins: dict[str, str] | None = None) -> str:
    """A run report and/or a selfcheck JSON (kill matrix) as Markdown, for ``$GITHUB_STEP_SUMMARY``; with
    ``pins`` (:func:`harness.upstream.read_pins`), the report's upstream versions beside them (the drift job)."""
    out: list[str] = []
    if report is not None:
        setup = report["setup"]
        out += ["### Harness run report", "",
                f"device `{setup['device']}` ({setup['device_class']}), graph backend `{setup['graph_backend']}`, "
                f"torch {setup['torch']}, transformers {setup['transformers']}, "
                f"implementations `{setup['implementations']}`", ""]
        pins = pins if pins is not None else report.get("pins") or None
        if pins is not None:
            out += _upstream_table(setup.get("upstream", {}), pins)
        out += [
                "| component | passed | failed | errors | skipped |", "| --- | --- | --- | --- | --- |"]
        out += [f"| {c} | {n.get('passed', 0)} | {n.get('failed', 0)} | {n.get('error', 0)} | {n.get('skipped', 0)} |"
                for c, n in report["outcomes"].items()]
        out += ["", "| dtype | largest error | share of tolerance | rtol | atol |", "| --- | --- | --- | --- | --- |"]
        out += [f"| {d} | {e['max_abs_error']:.3g} | {100 * e['tolerance_used']:.1f}% | {e['rtol']:g} | {e['atol']:g} |"
                for d, e in report["errors"].items()]
        if report["counters"]:
            out += ["", "counters: " + ", ".join(f"`{k}`={v}" for k, v in report["counters"].items())]
        goldens = report["goldens"]
        for e in goldens["drift"]:
            out.append(f"- golden `{e['golden']}` {e['where']}: {e['kind']} ({e['device_class']})")
            if e.get("differences"):
                out += ["", "  ```diff", *(f"  {line}" for line in e["differences"]), "  ```", ""]
            if e.get("record"):
                out.append(f"  record it: `{e['record']}`")
        out += [f"- **orphaned golden** `{name}`" for name in goldens["orphans"]]
        if pins is not None and not goldens["drift"]:
            out.append("- no golden drifted: every record holds for these versions")
    if kill_matrix is not None:
        out += ["", "### Kill matrix", "", "| component | implementation | verdict | seconds | first failing test |",
                "| --- | --- | --- | --- | --- |"]
        out += [f"| {o['component']} | {o['spec']} | {o['verdict']} | {o['seconds']:.1f} | "
                f"`{o['first_failure'] or '-'}` |"
                for o in kill_matrix]
    return "\n".join(out) + "\n"


def _upstream_table(installed: dict[str, str], pins: dict[str, str]) -> list[str]:
    rows = ["| package | pinned (constraints) | installed | |", "| --- | --- | --- | --- |"]
    for name, version in sorted(installed.items()):
        pinned = pins.get(name)
        moved = _moved(version, pinned) if pinned is not None else ""
        rows.append(f"| {name} | {pinned or 'not pinned'} | {version} | {'**newer**' if moved == 'newer' else moved} |")
    return [*rows, ""]


def write_step_summary(text: str) -> None:
    """Append to ``$GITHUB_STEP_SUMMARY`` when set (in GitHub Actions), else print."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if target:
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(text)
    else:
        print(text, end="")


def annotations(junit_path: str) -> list[str]:
    """GitHub ``::error`` workflow commands, one per failed or erroring test of a JUnit XML file
    (written with ``junit_family = xunit1``, which records each test's file and line)."""
    import xml.etree.ElementTree as ElementTree

    if not Path(junit_path).is_file():
        return []
    lines = []
    for case in ElementTree.parse(junit_path).getroot().iter("testcase"):
        for problem in [*case.findall("failure"), *case.findall("error")]:
            message = (problem.get("message") or problem.text or "failed").strip().splitlines()[0][:300]
            escape = lambda text: text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")  # noqa: E731
            where = f"file={case.get('file')},line={int(case.get('line') or 0) + 1}," if case.get("file") else ""
            lines.append(f"::error {where}title={escape(case.get('name', 'test'))}::{escape(message)}")
    return lines
