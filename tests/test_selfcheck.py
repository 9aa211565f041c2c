"""The kill matrix's machinery: hinted tests run first, the first failure is timed, hints round-trip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness import selfcheck


def test_hinted_test_runs_first_and_its_failure_is_timed(tmp_path: Path):
    (tmp_path / "test_two.py").write_text(
        "def test_first_in_file():\n    assert False, 'first'\n\n"
        "def test_second_in_file():\n    assert False, 'second'\n")
    report = tmp_path / "first.json"
    environment = dict(os.environ, HARNESS_RUN_FIRST="test_two.py::test_second_in_file\n",
                       HARNESS_FIRST_FAILURE=str(report), HARNESS_STARTED_AT=repr(time.time()))
    completed = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                "-p", "harness._selfcheck_plugin", "--rootdir", str(tmp_path), "-c", os.devnull,
                                str(tmp_path)], cwd=tmp_path, env=environment, capture_output=True, text=True)
    assert completed.returncode == 1, completed.stdout + completed.stderr
    record = json.loads(report.read_text())
    assert record["nodeid"] == "test_two.py::test_second_in_file"
    assert record["when"] == "call" and 0 <= record["seconds"] < 120


def test_without_a_hint_the_suite_order_stands(tmp_path: Path):
    (tmp_path / "test_two.py").write_text(
        "def test_a():\n    assert False\n\ndef test_b():\n    assert False\n")
    report = tmp_path / "first.json"
    environment = dict(os.environ, HARNESS_RUN_FIRST="", HARNESS_FIRST_FAILURE=str(report))
    subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p",
                    "harness._selfcheck_plugin", "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
                   cwd=tmp_path, env=environment, capture_output=True, text=True)
    assert json.loads(report.read_text())["nodeid"] == "test_two.py::test_a"


def _outcome(spec: str, verdict: str, test: str, backend: str) -> selfcheck.Outcome:
    return selfcheck.Outcome("graphs", spec, "mutant", verdict, test, 1.0, "", "", 0.5, backend)


def test_hints_round_trip_and_keep_other_backends(tmp_path: Path):
    selfcheck.write_hints(tmp_path, [_outcome("mutant:a", "killed", "suites/graphs/t.py::x", "cuda")])
    selfcheck.write_hints(tmp_path, [_outcome("mutant:a", "killed", "suites/graphs/t.py::y", "emulated"),
                                     _outcome("mutant:b", "survived", "", "emulated")])
    hints = selfcheck.read_hints(tmp_path)
    assert hints == {("graphs", "mutant:a", "cuda"): "suites/graphs/t.py::x",
                     ("graphs", "mutant:a", "emulated"): "suites/graphs/t.py::y"}


def test_default_jobs_on_the_cpu_is_the_core_count():
    assert selfcheck.default_jobs("cpu") == (os.cpu_count() or 1)


def _run(component: str, spec: str, kind: str, verdict: str, first: str, failures: tuple[str, ...] = ()):
    return selfcheck.Outcome(component, spec, kind, verdict, first, 1.0, f"pytest suites/{component}", "", 0.5,
                             "cuda", failures or ((first,) if first else ()))


def test_a_failing_reference_leaves_its_mutants_not_judged():
    outcomes = selfcheck.judge([
        _run("runner", "reference", "reference", "failed", "suites/runner/t.py::a", ("suites/runner/t.py::a",)),
        _run("runner", "mutant:x", "mutant", "killed", "suites/runner/t.py::a"),
        _run("runner", "mutant:y", "mutant", "killed", "suites/runner/t.py::b"),
        _run("gather", "reference", "reference", "passed", ""),
        _run("gather", "mutant:z", "mutant", "killed", "suites/gather/t.py::c"),
    ])
    verdicts = {o.spec: o.verdict for o in outcomes}
    assert verdicts == {"reference": "passed", "mutant:x": "not judged", "mutant:y": "not judged",
                        "mutant:z": "killed"}
    assert not any(o.ok for o in outcomes if o.verdict == "not judged")
    table = selfcheck.format_matrix(outcomes)
    assert table.splitlines()[0].startswith("REFERENCE FAILED: runner"), table
    assert "suites/runner/t.py::a" in table.splitlines()[0]
    assert "1 of 3 mutants killed, 2 NOT JUDGED" in table and "3/3" not in table and "1/3" not in table


def test_a_passing_matrix_reads_n_of_n():
    outcomes = selfcheck.judge([_run("gather", "reference", "reference", "passed", ""),
                                _run("gather", "mutant:z", "mutant", "killed", "suites/gather/t.py::c")])
    assert "1/1 mutants killed" in selfcheck.format_matrix(outcomes)
