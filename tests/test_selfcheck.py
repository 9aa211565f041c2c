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


def test_a_mutant_judged_on_cuda_only_is_skipped_elsewhere_and_says_so(tmp_path: Path, monkeypatch):
    """Mutants declaring ``backends={"cuda"}`` are not run by the emulated selfcheck: their outcome is
    ``skipped``, names the backends that judge them, counts as OK, and moves no kill-matrix entry."""
    from harness import impls, kill_matrix

    ran: list[str] = []

    def fake_run_one(impl, **_: object) -> selfcheck.Outcome:
        ran.append(impl.name)
        verdict = "passed" if impl.kind == "reference" else "killed"
        return selfcheck.Outcome(impl.component, impl.name, impl.kind, verdict, "suites/graphs/t.py::x", 1.0, "",
                                 impl.bug, 0.5, "emulated")

    monkeypatch.setattr(selfcheck, "run_one", fake_run_one)
    outcomes = selfcheck.run_selfcheck(components=["graphs"], graph_backend="emulated", device="cpu", jobs=1,
                                       root=tmp_path)
    cuda_only = {impl.name for impl in impls.mutants("graphs") if impl.backends == {"cuda"}}
    assert {"mutant:warm-up-skipped", "mutant:default-pool-shared"} <= cuda_only
    assert not cuda_only & set(ran), "a mutant judged on cuda only ran on the emulated backend"
    skipped = {o.spec: o for o in outcomes if o.verdict == "skipped"}
    assert set(skipped) == cuda_only
    assert all(o.ok and "judged on cuda only" in o.first_failure for o in skipped.values())
    assert "not judged on this graph backend" in selfcheck.format_matrix(outcomes)
    assert not [line for line in kill_matrix.changes(tmp_path, list(skipped.values()))]


def test_mutant_backends_must_be_known_graph_backends():
    import pytest

    from harness.mutants import MutantSet

    mutants = MutantSet("graphs")
    with pytest.raises(ValueError, match="unknown graph backends"):
        mutants.add("x", bug="a bug", backends={"gpu"})
    with pytest.raises(ValueError, match="a set of names"):
        mutants.add("y", bug="a bug", backends="cuda")
