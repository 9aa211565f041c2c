"""The component table: every row is complete, and the package has no import cycle."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import components, impls
from harness.mutants import MutantSet

ROOT = Path(__file__).resolve().parent.parent
ROWS = components.COMPONENTS


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_every_component_has_its_suite_doc_reference_oracle_and_mutants(row):
    importlib.import_module(row.package)
    for field in ("reference", "oracle", "validator"):
        assert callable(pkgutil.resolve_name(getattr(row, field))), f"{row.name}.{field} = {getattr(row, field)}"
    mutant_set = importlib.import_module(row.mutants).MUTANTS
    assert isinstance(mutant_set, MutantSet) and mutant_set.component == row.name
    assert len(mutant_set) >= 1, f"{row.name} has no mutant: nothing shows its suites can fail"
    assert all(mutant.bug for mutant in mutant_set)
    assert list((ROOT / row.suite).glob("test_*.py")), f"{row.suite} holds no test module"
    assert (ROOT / row.doc).is_file(), f"{row.doc} is missing"
    assert not row.fixture.endswith("_impl"), "name the fixture for what it yields"


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_the_reference_passes_its_own_validator(row):
    implementation = impls.load(row.name, "reference")
    assert implementation.kind == "reference"


def test_fixture_names_are_unique():
    names = [row.fixture for row in ROWS]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_readme_lists_every_component(row):
    readme = (ROOT / "README.md").read_text()
    assert f"| `{row.name}` |" in readme and row.suite in readme and row.doc in readme, (
        f"README's component table lacks a row for {row.name} (name, suite, doc)")


def _module_imports(path: Path, package_root: Path) -> set[str]:
    """Modules of ``harness`` that ``path`` imports, at module level or inside functions (a lazy import
    that closes a cycle is a cycle too: it only moves the failure to the first call)."""
    tree = ast.parse(path.read_text())
    module = ".".join(path.relative_to(package_root.parent).with_suffix("").parts).removesuffix(".__init__")
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: -node.level + (1 if path.name == "__init__.py" else 0) or None]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value)  # importlib.import_module("harness.x") is an import too
    return {name for name in found if name.startswith("harness")}


def test_the_package_has_no_import_cycle():
    package_root = ROOT / "harness"
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in package_root.rglob("*.py")}
    def ancestors(name: str) -> set[str]:
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts))}

    # Importing your own parent package is no cycle: it is already being imported when you are.
    graph = {name: {target for target in _module_imports(path, package_root)
                    if target in modules and target != name and target not in ancestors(name)}
             for name, path in modules.items()}
    # Importing a submodule imports its parent packages first.
    for name in list(graph):
        for target in list(graph[name]):
            graph[name].update(parent for parent in ancestors(target) if parent in modules
                               and parent != name and parent not in ancestors(name))
    visiting, done, cycle = set(), set(), []

    def visit(node: str, stack: list[str]) -> None:
        if node in done or cycle:
            return
        if node in visiting:
            cycle.extend(stack[stack.index(node):] + [node])
            return
        visiting.add(node)
        for target in sorted(graph[node]):
            visit(target, stack + [node])
        visiting.discard(node)
        done.add(node)

    for name in sorted(graph):
        visit(name, [])
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_importing_a_component_registers_nothing():
    """Components exist because of the table, not because something was imported first: importing them imports
    no mutant, and the registry (:mod:`harness.impls`, which holds no state of its own) reads the table."""
    code = ("import sys, harness.graphs, harness.runner, harness.gather; "
            "print(sorted(m for m in sys.modules if m.startswith('harness.mutants')))")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert completed.stdout.strip() == "[]"


def test_an_included_mutant_set_keeps_each_mutants_backends():
    """A mutant judged on CUDA only stays so when its module's set is included into the component's."""
    inner, outer = MutantSet("graphs"), MutantSet("graphs")
    inner.add("cuda-only", bug="a bug only a CUDA stream shows", backends={"cuda"})(object())
    inner.add("anywhere", bug="a bug every backend shows")(object())
    outer.include(inner)
    assert {mutant.name: mutant.backends for mutant in outer} == {"cuda-only": frozenset({"cuda"}),
                                                                   "anywhere": frozenset()}
