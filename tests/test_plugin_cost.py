"""The plugin costs nothing where unused: an engine's own pytest run, in a folder without harness tests, imports
none of torch, hypothesis's engine or the harness's models through it, only the harness's small modules that
declare its options and hooks (``python -X importtime`` counts them)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

# What only an active harness may load, beyond what bare pytest loads (syrupy's and hypothesis's own plugins).
HEAVY = ("torch", "transformers", "numpy", "syrupy", "harness.models", "harness.graphs", "harness.compare",
         "harness.golden", "harness.runner", "harness.gather", "harness.plugin.profiles")
# The harness's modules the plugin may load to declare its options, markers, hooks and fixtures.
MOST_HARNESS_MODULES = 16


def _imported(folder: Path, *arguments: str) -> dict[str, int]:
    """Module -> its own import time in microseconds, for a pytest run of ``folder``'s test file."""
    completed = subprocess.run([sys.executable, "-X", "importtime", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                "test_unrelated.py", *arguments], cwd=folder, capture_output=True, text=True,
                               timeout=120)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    rows = re.findall(r"^import time:\s+(\d+) \|\s+\d+ \|( *)(\S+)$", completed.stderr, re.MULTILINE)
    return {name: int(own) for own, _, name in rows}


def test_an_unrelated_run_loads_only_the_declarations(tmp_path: Path):
    (tmp_path / "test_unrelated.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    with_plugin = _imported(tmp_path)
    bare = _imported(tmp_path, "-p", "no:harness.plugin")
    assert "harness.plugin.session" in with_plugin and "harness.plugin.session" not in bare
    extra = {name: own for name, own in with_plugin.items() if name not in bare}
    heavy = sorted(name for name in extra if name.split(".")[0] in HEAVY or name.startswith(HEAVY))
    assert not heavy, f"an unrelated run imported {heavy[:10]} through the harness's plugin"
    foreign = sorted(name for name in extra if not name.startswith("harness"))
    harness_modules = sorted(name for name in extra if name.startswith("harness"))
    # the standard library modules the harness's own need (dataclasses, shlex, ...), a handful at most
    assert len(foreign) <= 8, f"the plugin brought in {foreign}"
    assert len(harness_modules) <= MOST_HARNESS_MODULES, (
        f"{len(harness_modules)} harness modules ({sum(extra.values()) / 1e3:.0f} ms): {harness_modules}")


@pytest.mark.parametrize("entry", ["harness", "harness.plugin", "harness.devices"])
def test_importing_the_facade_imports_no_torch(entry: str):
    code = f"import sys, {entry}; print(sorted(m for m in ('torch', 'hypothesis') if m in sys.modules))"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert completed.stdout.strip() == "[]"
