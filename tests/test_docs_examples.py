"""Every code example in docs/ that shows an implementation is a file under docs/examples that its
component's suite passes, and the doc shows that file verbatim.

A doc marks such a block with ``<!-- example docs/examples/PATH: --impl COMPONENT=SPEC -->`` on the line
before it; a block that cannot run (a component that does not exist) says why with ``<!-- sketch: ...
-->``. A Python block that defines a function or class with neither marker fails here.

The fenced block right after an example holds the commands that run it, from the root of a harness
checkout (``PYTHONPATH=docs/examples``, where the example engine ``my_engine`` lives): the first is run
here exactly as written (split as a shell splits it, ``NAME=value`` words as its environment); the
others are the same run with more options (on CUDA), so none of them can drift from the file.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.selfcheck import reference_workers

ROOT = Path(__file__).resolve().parent.parent
_BLOCK = re.compile(r"(?:^(?P<marker><!--.*?-->)\n)?^```python\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
_EXAMPLE = re.compile(r"<!-- example (?P<path>docs/examples/\S+): --impl (?P<component>\w+)=(?P<spec>\S+) -->")
_FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# What a command naming an example's spec starts with: the examples' package is importable from there.
_EXAMPLES_PATH = "PYTHONPATH=docs/examples "


def _blocks() -> list[tuple[str, str | None, str]]:
    return [(doc.relative_to(ROOT).as_posix(), match["marker"], match["body"])
            for doc in sorted((ROOT / "docs").glob("*.md")) for match in _BLOCK.finditer(doc.read_text())]


def _examples() -> list[tuple[str, str, str, str]]:
    found = []
    for doc, marker, body in _blocks():
        match = _EXAMPLE.fullmatch(marker or "")
        if match:
            found.append((doc, match["path"], f"{match['component']}={match['spec']}", body))
    return found


def test_every_implementation_shown_in_the_docs_is_an_example_file_or_says_why_not():
    unmarked = [(doc, body.splitlines()[0]) for doc, marker, body in _blocks()
                if re.search(r"^\s*(?:def|class) ", body, re.MULTILINE)
                and not (_EXAMPLE.fullmatch(marker or "") or re.fullmatch(r"<!-- sketch: .+ -->", marker or ""))]
    assert not unmarked, f"implementation blocks with no example file or sketch reason: {unmarked}"
    assert {spec.split("=")[0] for _, _, spec, _ in _examples()} == {"graphs", "runner", "gather"}


@pytest.mark.parametrize("doc,path,spec,body", _examples(), ids=lambda value: str(value)[:40])
def test_the_doc_shows_the_example_file_verbatim(doc, path, spec, body):
    assert body == (ROOT / path).read_text(), f"{doc}: the block differs from {path}; paste the file into the doc"


def _commands(block: str) -> list[str]:
    return [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]


def _example_commands() -> list[tuple[str, str, list[str]]]:
    """``(doc, component=spec, commands)`` for every example: the fenced block right after its own."""
    found = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        text = doc.read_text()
        fences = list(_FENCE.finditer(text))
        for index, fence in enumerate(fences):
            marker = text[:fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
            example = _EXAMPLE.fullmatch(marker)
            if fence["lang"] == "python" and example:
                following = fences[index + 1] if index + 1 < len(fences) else None
                commands = _commands(following["body"]) if following and following["lang"] in ("", "bash") else []
                found.append((doc.relative_to(ROOT).as_posix(), f"{example['component']}={example['spec']}",
                              commands))
    return found


@pytest.mark.parametrize("doc,spec,commands", _example_commands(), ids=[spec for _, spec, _ in _example_commands()])
def test_each_example_is_followed_by_the_commands_that_run_it(doc, spec, commands):
    assert commands, f"{doc}: the example of --impl {spec} has no command block right after it"
    first, *others = commands
    words = shlex.split(first, comments=True)
    assert first.startswith(_EXAMPLES_PATH) and "--impl" in words and words[words.index("--impl") + 1] == spec, (
        f"{doc}: the first command after the example of --impl {spec} must run it from a checkout's root "
        f"({_EXAMPLES_PATH.strip()} ... --impl {spec}): {first!r}")
    drifted = [command for command in others if not command.startswith(first + " ")]
    assert not drifted, f"{doc}: commands that are not {first!r} with more options: {drifted}"


def test_every_command_naming_an_example_says_where_the_example_imports_from():
    specs = {spec.split("=", 1)[1] for _, spec, _ in _example_commands()}
    bare = [(doc.relative_to(ROOT).as_posix(), line)
            for doc in sorted((ROOT / "docs").glob("*.md")) for fence in _FENCE.finditer(doc.read_text())
            if fence["lang"] != "python" for line in _commands(fence["body"])
            if any(spec in line for spec in specs) and not line.startswith(_EXAMPLES_PATH)]
    assert not bare, f"commands that run an example but do not start with {_EXAMPLES_PATH!r}: {bare}"


# A whole suite each (a minute of CPU for the three on 2 cores, most of this file's): slow_child, so a plain
# `pytest tests/` leaves them out (tests/conftest.py); .ci/run, ci.yml and the GPU check run them.
@pytest.mark.slow_child
@pytest.mark.long_running
@pytest.mark.parametrize("doc,spec,command", [pytest.param(doc, spec, commands[0], id=spec)
                                              for doc, spec, commands in _example_commands() if commands])
def test_the_docs_command_passes_the_examples_suite(doc, spec, command):
    """The doc's first command after the example, exactly as written, from the checkout's root: its
    ``NAME=value`` words are its environment (a ``PYTHONPATH`` this run already has, where the harness
    under test may come from, stays after the doc's), its program this interpreter's (as in the activated
    virtual environment the README sets up)."""
    words = shlex.split(command, comments=True)
    assignments = []
    while words and _ASSIGNMENT.match(words[0]):
        assignments.append(words.pop(0).split("=", 1))
    environment = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")}
    for name, value in assignments:
        inherited = os.environ.get(name) if name == "PYTHONPATH" else None
        environment[name] = os.pathsep.join(filter(None, [value, inherited]))
    program = shutil.which(words[0], path=str(Path(sys.executable).parent))
    if program is None and words[0] in ("pytest", "python"):
        # An interpreter whose pytest came without its script (wheels installed with --target on a GPU machine):
        # the script is `python -m pytest`'s entry point, pytest.console_main.
        program = sys.executable
        words[1:1] = ["-m", "pytest"] if words[0] == "pytest" else []
    assert program, f"{doc}: no {words[0]!r} beside {sys.executable} to run {command!r}"
    # A whole suite in one child, spread over xdist workers where cores allow as the kill matrix spreads a
    # reference's, serial on a small machine; the workers go through PYTEST_ADDOPTS, not into the command.
    workers = reference_workers()
    if workers > 1:
        environment["PYTEST_ADDOPTS"] = " ".join(filter(None, [os.environ.get("PYTEST_ADDOPTS"), f"-n {workers}"]))
    completed = subprocess.run([program, *words[1:]], cwd=ROOT, env=environment, capture_output=True, text=True,
                               timeout=900)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, f"{doc}: {command}\n" + output[-5000:]
    assert re.search(r"\b\d+ passed\b", output), output[-5000:]
