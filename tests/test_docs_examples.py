"""Every code example in docs/ that shows an implementation is a file under docs/examples that its
component's suite passes, and the doc shows that file verbatim.

A doc marks such a block with ``<!-- example docs/examples/PATH: --impl COMPONENT=SPEC -->`` on the line
before it; a block that cannot run (a component that does not exist) says why with ``<!-- sketch: ...
-->``. A Python block that defines a function or class with neither marker fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.selfcheck import reference_workers

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"
_BLOCK = re.compile(r"(?:^(?P<marker><!--.*?-->)\n)?^```python\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
_EXAMPLE = re.compile(r"<!-- example (?P<path>docs/examples/\S+): --impl (?P<component>\w+)=(?P<spec>\S+) -->")


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


@pytest.mark.long_running
@pytest.mark.parametrize("spec", [spec for _, _, spec, _ in _examples()])
def test_the_example_passes_its_suite(spec):
    component = spec.split("=")[0]
    environment = {**{k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")},
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")]))}
    # The example engine runs on one rank: its adapter is held to the single-rank contract (--tp 1 leaves
    # the tensor-parallel cases out, as it would for any engine without tensor parallelism).
    # A whole suite in one child, spread over xdist workers where cores allow as the kill matrix spreads a
    # reference's (on a GPU runner the examples' suites on CUDA, run serially, took most of the GPU check's
    # tests step), serial on a small machine.
    workers = reference_workers()
    completed = subprocess.run([sys.executable, "-m", "pytest", f"suites/{component}", "--impl", spec, "-q",
                                "-p", "no:cacheprovider", *(["--tp", "1"] if component == "runner" else []),
                                *(["-n", str(workers)] if workers > 1 else [])],
                               cwd=ROOT, env=environment, capture_output=True, text=True, timeout=900)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-5000:]
    assert re.search(r"\b\d+ passed\b", output), output[-5000:]
