"""The engines' minimal reproductions (.ci/gpu/sglang-repros, vllm-repros, trtllm-repros) on a machine without a GPU:
each parses, imports only the standard library, torch and its own engine (so it runs standalone next to the
engine), names a declared clause and its tier for every case, lists its cases, and refuses without CUDA in one
line. What the cases find is read on a GPU (.ci/gpu/engine-conformance writes ENGINE-repros.log)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.conformance.clauses import clauses_of

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {engine: ROOT / ".ci" / "gpu" / f"{engine}-repros" for engine in ("sglang", "vllm", "trtllm")}
# The top-level package each engine's script may import besides torch and the standard library.
PACKAGES = {"sglang": "sglang", "vllm": "vllm", "trtllm": "tensorrt_llm"}
LISTED = re.compile(r"^(?P<component>\w+) (?P<name>\w+) \[(?P<clause>[\w-]+), (?P<tier>\w+)\]$")


def _run(script: Path, *arguments: str) -> subprocess.CompletedProcess:
    # No device visible, whatever machine runs this: the refusal is what is checked.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, str(script), *arguments], capture_output=True, text=True, env=env,
                          timeout=120)


# The scripts' shared part, beside them (.ci/gpu/repro_cases.py): the standard library and torch only.
SHARED = ROOT / ".ci" / "gpu" / "repro_cases.py"


def _top_level_imports(script: Path) -> set[str]:
    imported = set()
    for node in ast.walk(ast.parse(script.read_text(), filename=str(script))):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
    return imported - set(sys.stdlib_module_names)


@pytest.mark.parametrize("engine", sorted(SCRIPTS))
def test_a_reproduction_script_imports_only_torch_and_its_engine(engine):
    outside = _top_level_imports(SCRIPTS[engine]) - {"torch", PACKAGES[engine], SHARED.stem}
    assert not outside, f"{SCRIPTS[engine].name} imports {sorted(outside)}: it must run with torch and {engine} alone"
    assert _top_level_imports(SHARED) == {"torch"}, f"{SHARED.name} must import the standard library and torch only"


@pytest.mark.parametrize("engine", sorted(SCRIPTS))
def test_a_reproduction_script_lists_each_case_under_a_declared_clause(engine):
    completed = _run(SCRIPTS[engine], "--list")
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines, f"{SCRIPTS[engine].name} --list printed nothing"
    for line in lines:
        listed = LISTED.match(line)
        assert listed, f"{SCRIPTS[engine].name} --list: {line!r} is not 'COMPONENT NAME [CLAUSE, TIER]'"
        declared = {clause.id: clause.tier for clause in clauses_of(listed["component"])}
        assert declared.get(listed["clause"]) == listed["tier"], (
            f"{line!r}: {listed['component']} declares {listed['clause']!r} as {declared.get(listed['clause'])}")
    if engine != "trtllm":  # The H200's pools violation, in SGLang's and vLLM's own API.
        assert "graphs break_argument_recarved_by_a_later_capture [pools, core]" in lines
    # What each engine does with a break that raises during capture and is handled, in its own API (issue 44).
    assert any(line.endswith(" [handled-break-errors, core]") for line in lines), lines


@pytest.mark.parametrize("engine", sorted(SCRIPTS))
def test_a_reproduction_script_refuses_without_cuda_in_one_line(engine):
    completed = _run(SCRIPTS[engine], "graphs")
    assert completed.returncode == 2
    assert completed.stdout == f"{engine}-repros: needs a CUDA GPU\n" and not completed.stderr
