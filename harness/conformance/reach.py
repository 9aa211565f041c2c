"""Reach: which lines and branches of the implementation's own modules a conformance run executed.

A report says which clauses held; it cannot say what no test ran. The lines of an engine's breakable graph, runner
or gather that no test executed are where the next unreported bug lives. In a conformance run, every pytest process
(each xdist worker too) measures the implementation's modules with coverage.py, by module name, branches included;
the parent combines the data and lists, per module, the lines and branches reached and the unreached lines of each
function. Without coverage.py installed the report says reach was not measured, and why.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from harness import components

__all__ = ["REACH_VARIABLE", "ModuleReach", "modules_of", "start_measuring", "stop_measuring", "measure",
           "unavailable"]

#: Set by ``run_conformance`` for its child: ``{"modules": [...], "data": folder}`` as JSON.
REACH_VARIABLE = "HARNESS_CONFORMANCE_REACH"

# The reference's own modules, by component: what its conformance reports measure.
_REFERENCE_MODULES = {
    "graphs": ("harness.graphs._breakable", "harness.graphs._seam"),
    "runner": ("harness.runner.runner", "harness.runner.discovery"),
    "gather": ("harness.gather.reference",),
}


@dataclasses.dataclass
class ModuleReach:
    """One module: its file (relative to its package root), the lines and branches of its functions and methods
    reached of all, and each function with lines no test executed (qualified name -> those line numbers)."""

    module: str
    file: str
    lines: int
    lines_reached: int
    branches: int
    branches_reached: int
    unreached: dict[str, list[int]]


def modules_of(component: str, spec: str) -> tuple[str, ...]:
    """The modules whose reach a report of ``spec`` measures: an engine adapter's ``REACHED[component]`` (the
    engine's modules it runs), the reference's own for the reference and its mutants, the module of an external
    ``pkg.mod:attr``."""
    adapter = components.get_component(component).adapter_module(spec)
    if adapter is not None:
        return tuple(getattr(adapter, "REACHED", {}).get(component, ()))
    if ":" in spec and not spec.startswith("mutant:"):
        return (spec.partition(":")[0],)
    return _REFERENCE_MODULES.get(component, ())


def unavailable() -> str:
    """Why reach cannot be measured here, or empty."""
    if importlib.util.find_spec("coverage") is None:
        return "coverage.py is not installed (pip install -c constraints.txt coverage)"
    return ""


_MEASURING: list[Any] = []


def start_measuring() -> None:
    """In a conformance run's pytest process (the plugin calls it at configure): measure the modules the parent
    named, into a data file of this process."""
    setting = os.environ.get(REACH_VARIABLE)
    if not setting or unavailable() or _MEASURING:
        return
    import coverage

    wanted = json.loads(setting)
    measurer = coverage.Coverage(data_file=str(Path(wanted["data"]) / ".coverage"), data_suffix=True, branch=True,
                                 source_pkgs=list(wanted["modules"]), config_file=False)
    measurer.start()
    _MEASURING.append(measurer)


def stop_measuring() -> None:
    """Stop and save this process's measurement (the plugin calls it at unconfigure)."""
    while _MEASURING:
        measurer = _MEASURING.pop()
        measurer.stop()
        measurer.save()


def measure(data: Path, modules: tuple[str, ...]) -> list[ModuleReach]:
    """Combine the data files in ``data`` and read each measured module's reach."""
    import coverage

    measurer = coverage.Coverage(data_file=str(data / ".coverage"), branch=True, source_pkgs=list(modules),
                                 config_file=False)
    measurer.combine([str(data)], keep=False)
    measurer.load()
    if not measurer.get_data().measured_files():
        return []
    report_path = data / "reach.json"
    measurer.json_report(outfile=str(report_path), ignore_errors=True)
    document = json.loads(report_path.read_text())
    found = []
    for path, entry in sorted(document["files"].items()):
        # Function and method bodies only: a module's top level runs at import, which may come before measuring
        # starts (the harness's own modules are imported with its plugin) and says nothing of what a test reached.
        functions = {name: function for name, function in entry.get("functions", {}).items() if name}
        summaries = [function["summary"] for function in functions.values()]
        found.append(ModuleReach(
            module=_module_name(path, modules), file=_package_relative(path, modules),
            lines=sum(summary["num_statements"] for summary in summaries),
            lines_reached=sum(summary["covered_lines"] for summary in summaries),
            branches=sum(summary.get("num_branches", 0) for summary in summaries),
            branches_reached=sum(summary.get("covered_branches", 0) for summary in summaries),
            unreached={name: function["missing_lines"] for name, function in functions.items()
                       if function["missing_lines"]}))
    return found


def _package_relative(path: str, modules: tuple[str, ...]) -> str:
    """``path`` from the folder its measured package sits in (``sglang/srt/...py``)."""
    parts = Path(path).parts
    tops = {module.split(".")[0] for module in modules}
    for index, part in enumerate(parts):
        if part in tops:
            return "/".join(parts[index:])
    return Path(path).name


def _module_name(path: str, modules: tuple[str, ...]) -> str:
    relative = _package_relative(path, modules)
    return relative.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
