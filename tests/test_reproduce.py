"""Failures a user can act on: the reproduce line reruns the failure from anywhere, a failing golden
says how to update it.

One pytest run forces three failures with mutants (a ``@given`` test, a hypothesis state machine, a
golden), each reproduce line is then run from another, fresh directory in a new process, where no
example database holds the failure (the ci profile keeps none anyway), and must fail the same way:
for hypothesis tests with the same falsifying example.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

# test id -> what its failure must show again when the reproduce line reruns it
FAILURES = {
    "suites/graphs/test_programs.py::test_replay_after_refill_equals_eager": "MismatchError",
    "suites/graphs/test_stateful.py::test_graph_lifecycle": "MismatchError",
    "suites/runner/test_goldens.py::test_capture_plan[dense]": "AssertionError",
}
# no-writeback is killed by the first two tests; whole-model-capture changes the discovered module,
# which the capture-plan golden pins. The runner comes from an outside module found through PYTHONPATH
# only, as a user's engine code would: the reproduce line must carry it.
MUTANTS = ["--impl", "graphs=mutant:no-writeback", "--impl", "runner=outside_runner:make_runner"]
OUTSIDE_MODULE = """from harness import impls

make_runner = impls.load("runner", "mutant:whole-model-capture").obj
"""


# What this interpreter itself needs on PYTHONPATH (empty where the harness is installed, as in a user's CI;
# the checkout and carried wheels where .ci/gpu/run puts them there): kept after the outside module's folder,
# as a user's shell would keep it, so a child finds the harness and syrupy the way this process did.
HARNESS_PYTHONPATH = os.environ.get("PYTHONPATH", "")


def _environment(**extra: str) -> dict[str, str]:
    drop = ("CI", "HYPOTHESIS_PROFILE", "PYTHONPATH")
    environment = {**{key: value for key, value in os.environ.items() if key not in drop}, **extra}
    path = os.pathsep.join(p for p in (extra.get("PYTHONPATH", ""), HARNESS_PYTHONPATH) if p)
    if path:
        environment["PYTHONPATH"] = path
    return environment


def _pytest(args: list[str], cwd: Path, **environment: str) -> str:
    completed = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=cwd, capture_output=True, text=True,
                               timeout=600, env=_environment(**environment))
    return completed.stdout + completed.stderr


def _shell(line: str, cwd: Path) -> str:
    """Run a pasted command line in a new shell, with no PYTHONPATH beyond what the harness itself needs here."""
    completed = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=600,
                               env=_environment())
    return completed.stdout + completed.stderr


def _sections(output: str, title: str) -> dict[str, str]:
    """Per failed test (its id as pytest prints it in the failure header), the text of a report section."""
    headers = re.findall(r"^_{3,} (\S.*?) _{3,}$", output, flags=re.MULTILINE)
    bodies = re.split(r"^_{3,} \S.*? _{3,}$", output, flags=re.MULTILINE)[1:]
    sections = {}
    for header, body in zip(headers, bodies):
        match = re.search(rf"^-+ {title} -+\n(.*?)(?=^-{{3,}} |^={{3,}} |^_{{3,}} |\Z)", body, re.MULTILINE | re.DOTALL)
        if match:
            sections[header] = match[1].strip()
    return sections


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("outside")
    (folder / "outside_runner.py").write_text(OUTSIDE_MODULE)
    return folder


@pytest.fixture(scope="module")
def first_run(outside) -> str:
    """The three failures, run from the project root as usual, under the ci profile (no example database)."""
    return _pytest([*FAILURES, "-p", "no:cacheprovider", "--hypothesis-profile", "ci", *MUTANTS], cwd=ROOT,
                   PYTHONPATH=str(outside))


@pytest.mark.parametrize("nodeid", list(FAILURES))
def test_reproduce_line_reruns_the_same_failure_from_elsewhere(first_run, outside, tmp_path, nodeid):
    name = nodeid.split("::")[-1]
    lines = _sections(first_run, "reproduce")
    assert name in lines, f"no reproduce section for {name}:\n{first_run[-4000:]}"
    line = lines[name]
    assert "\n" not in line, line
    command = shlex.split(line)
    expected_path = os.pathsep.join(p for p in (str(outside), HARNESS_PYTHONPATH) if p)
    assert command[:4] == [f"PYTHONPATH={expected_path}", sys.executable, "-m", "pytest"], line
    assert command[4] == f"{ROOT}/{nodeid}", line
    device = "cuda" if torch.cuda.is_available() else "cpu"  # --device auto, as the first run had it
    for expected in (["--rootdir", str(ROOT)], ["--hypothesis-profile", "ci"], ["--device", device]):
        assert " ".join(expected) in " ".join(command), line
    hypothesis_test = "graphs" in nodeid
    explicit = "Failing explicit example" in first_run.split(f" {name} _")[1].split("\n____")[0]
    if hypothesis_test and not explicit:  # the falsifying example itself, replayable without the example database
        assert re.search(r"--reproduce-failure \S+:\S+", line), line

    elsewhere = tmp_path / "another" / "directory"
    elsewhere.mkdir(parents=True)
    again = _shell(f"{line} -p no:cacheprovider", cwd=elsewhere)
    assert re.search(r"\b1 failed\b", again), again[-4000:]
    assert FAILURES[nodeid] in again, again[-4000:]
    if hypothesis_test:
        # The same falsifying example: the mismatch line and the example (arguments or steps) agree.
        def example(output: str) -> list[str]:
            block = output.split(f" {name} _")[1].split("\n____")[0]
            mismatch = re.findall(r"^E\s+(harness\.errors\.MismatchError: .*)$", block, re.MULTILINE)[:1]
            context = re.findall(r"^E\s+((?:program|shape|seed|refill|capture_seed): .*)$", block, re.MULTILINE)
            steps = re.findall(r"^(?:E\s+)?(state\.\S.*|graphs_\d+ = .*)$", block, re.MULTILINE)
            return mismatch + context + steps

        assert example(first_run)[:1], first_run[-4000:]
        assert example(again) == example(first_run), again[-4000:]


def test_golden_failure_says_how_to_update_and_review(first_run):
    hint = _sections(first_run, "golden").get("test_capture_plan[dense]")
    assert hint, first_run[-4000:]
    assert "--snapshot-update" in hint and "git diff golden/" in hint
    update = next(line.strip() for line in hint.splitlines() if "--snapshot-update" in line)
    assert shlex.split(update)[4] == f"{ROOT}/suites/runner/test_goldens.py::test_capture_plan[dense]"
    # Only goldens get the hint: the hypothesis failures are not golden mismatches.
    assert set(_sections(first_run, "golden")) == {"test_capture_plan[dense]"}


def test_golden_hint_at_quiet_verbosity(outside):
    """The hint does not depend on how pytest words the assertion at a verbosity (first_run is the default)."""
    output = _pytest(["suites/runner/test_goldens.py::test_capture_plan[dense]", "-q", "-p", "no:cacheprovider",
                      "--impl", "runner=outside_runner:make_runner"], cwd=ROOT, PYTHONPATH=str(outside))
    assert "--snapshot-update" in _sections(output, "golden").get("test_capture_plan[dense]", ""), output[-4000:]


def test_a_relative_pythonpath_is_made_absolute_so_the_line_reruns_from_elsewhere(outside, tmp_path):
    """``PYTHONPATH=.`` in the engine's folder, as a user types it: the pasted line must still find the module."""
    nodeid = "suites/runner/test_goldens.py::test_capture_plan[dense]"
    output = _pytest([f"{ROOT}/{nodeid}", "-p", "no:cacheprovider", "--impl", "runner=outside_runner:make_runner"],
                     cwd=outside, PYTHONPATH=".")
    line = _sections(output, "reproduce").get("test_capture_plan[dense]")
    assert line, output[-4000:]
    expected_path = os.pathsep.join(p for p in (str(outside.resolve()), HARNESS_PYTHONPATH) if p)
    assert shlex.split(line)[0] == f"PYTHONPATH={expected_path}", line
    elsewhere = tmp_path / "a" / "new" / "shell"
    elsewhere.mkdir(parents=True)
    again = _shell(f"{line} -p no:cacheprovider", cwd=elsewhere)
    assert "No module named" not in again and re.search(r"\b1 failed\b", again), again[-4000:]
    assert FAILURES[nodeid] in again, again[-4000:]


@pytest.mark.parametrize(("value", "expected"), [
    (".", "/engine"),
    ("src:/opt/site:../shared", "/engine/src:/opt/site:/shared"),
    ("/abs/a::b/", "/abs/a:/engine:/engine/b"),  # an empty entry is the current folder to Python
    ("./x/../y", "/engine/y"),
])
def test_absolute_pythonpath(value, expected):
    from harness.plugin.child_runs import absolute_pythonpath

    assert absolute_pythonpath(value.replace(":", os.pathsep), "/engine") == expected.replace(":", os.pathsep)


@pytest.mark.parametrize("checkout", [True, False], ids=["checkout", "wheel"])
def test_rootdir_only_for_a_checkouts_suites(monkeypatch, tmp_path, checkout):
    """A wheel's suite file is named by its absolute path, without a --rootdir (the engine's folder the run
    started in, which need not exist where the line is pasted)."""
    import types

    from harness import locations
    from harness.devices import resolve
    from harness.graphs import backend_for
    from harness.plugin import failures
    from harness.plugin.session import SESSION_KEY, HarnessSession

    monkeypatch.setattr(locations, "is_checkout", lambda: checkout)
    session = HarnessSession(torch.device("cpu"), backend_for(resolve(device="cpu", graph_backend="emulated")),
                             {"gather": "my_engine:gather"}, "src")
    config = types.SimpleNamespace(rootpath=tmp_path / "engine", invocation_params=types.SimpleNamespace(dir=tmp_path),
                                   stash={SESSION_KEY: session}, getoption=lambda name, default=None: default)
    installed = "/venv/lib/python3.11/site-packages/harness/suites/gather/test_contract.py::test_x[hidden]"
    words = shlex.split(failures.reproduce_command(config, installed))
    assert words[0] == f"PYTHONPATH={tmp_path / 'src'}" and words[4] == installed
    assert ("--rootdir" in words) == checkout
    # no cache: the rootdir pytest finds for a wheel's suite file may be that file's folder, in the installed package
    assert ("no:cacheprovider" in words) == (not checkout)
    assert words[words.index("--impl") + 1] == "gather=my_engine:gather"
