"""The kill matrix's machinery: hinted tests run first, the first failure is timed, hints round-trip."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import impls, selfcheck
from harness.plugin import child_runs


def _child_run(folder: Path, **variables: str) -> tuple[child_runs.ChildRun, list[dict]]:
    """A selfcheck child's run of ``folder`` (``-x``, the selfcheck plugin), and its report log."""
    log = folder / "reports.jsonl"
    command = child_runs.pytest_command([folder], root=folder, plugin="harness.selfcheck.plugin", report_log=log,
                                        arguments=["-x", "-c", os.devnull])
    environment = dict(child_runs.child_environment(), **variables)
    finished = child_runs.run(command, cwd=folder, environment=environment, time_limit=120)
    return finished, child_runs.read_report_log(log)


def test_hinted_test_runs_first_and_its_failure_is_logged_before_the_early_exit(tmp_path: Path):
    (tmp_path / "test_two.py").write_text(
        "def test_first_in_file():\n    assert False, 'first'\n\n"
        "def test_second_in_file():\n    assert False, 'second'\n")
    started = time.time()
    finished, log = _child_run(tmp_path, HARNESS_RUN_FIRST="test_two.py::test_second_in_file\n",
                               HARNESS_EXIT_ON_FIRST_FAILURE="1")
    assert finished.returncode == 1, finished.output
    assert "short test summary" not in finished.output  # it exited at the failure: no summary
    (failure,) = [entry for entry in child_runs.phase_reports(log) if entry["outcome"] == "failed"]
    assert failure["nodeid"] == "test_two.py::test_second_in_file" and failure["when"] == "call"
    assert 0 <= failure["stop"] - started < 120  # what the matrix's seconds to kill are measured with
    assert child_runs.failed_nodeids(log) == ["test_two.py::test_second_in_file"]


def test_without_a_hint_the_suite_order_stands(tmp_path: Path):
    (tmp_path / "test_two.py").write_text(
        "def test_a():\n    assert False\n\ndef test_b():\n    assert False\n")
    finished, log = _child_run(tmp_path, HARNESS_RUN_FIRST="")
    assert finished.returncode == 1, finished.output
    assert child_runs.failed_nodeids(log) == ["test_two.py::test_a"]


def _outcome(spec: str, verdict: str, test: str, backend: str) -> selfcheck.Outcome:
    return selfcheck.Outcome("graphs", spec, "mutant", verdict, test, 1.0, "", "", 0.5, backend)


def test_the_kill_matrix_round_trips_and_keeps_other_backends(tmp_path: Path):
    selfcheck.write_kill_matrix(tmp_path, [_outcome("mutant:a", "killed", "suites/graphs/t.py::x", "cuda")])
    selfcheck.write_kill_matrix(tmp_path, [_outcome("mutant:a", "killed", "suites/graphs/t.py::y", "emulated"),
                                           _outcome("mutant:b", "survived", "", "emulated")])
    hints = selfcheck.read_hints(tmp_path)
    assert hints == {("graphs", "mutant:a", "cuda"): "suites/graphs/t.py::x",
                     ("graphs", "mutant:a", "emulated"): "suites/graphs/t.py::y"}


def test_a_slow_kill_is_recorded_and_cleared_by_a_fast_one(tmp_path: Path):
    def killed(spec: str, seconds_to_kill: float | None, seconds: float = 1.0) -> selfcheck.Outcome:
        return selfcheck.Outcome("graphs", spec, "mutant", "killed", "suites/graphs/t.py::x", seconds, "", "",
                                 seconds_to_kill, "cuda")

    slow = selfcheck.SLOW_KILL_SECONDS
    selfcheck.write_hints(tmp_path, [killed("mutant:slow", slow), killed("mutant:fast", slow - 0.1),
                                     killed("mutant:untimed", None, seconds=slow + 5)])
    assert selfcheck.read_slow_kills(tmp_path) == {("graphs", "mutant:slow", "cuda"),
                                                   ("graphs", "mutant:untimed", "cuda")}
    selfcheck.write_hints(tmp_path, [killed("mutant:slow", 1.0)])  # the same mutant, killed fast this time
    assert selfcheck.read_slow_kills(tmp_path) == {("graphs", "mutant:untimed", "cuda")}
    cached = selfcheck.read_hints_cache(tmp_path)
    assert cached["graphs", "mutant:slow", "cuda"]["killing_test"] == "suites/graphs/t.py::x"
    assert not (tmp_path / selfcheck.KILL_MATRIX_PATH).exists()  # timings never go into the golden


@pytest.mark.parametrize("reference_workers", [1, 3])
def test_slow_mutants_start_first_and_beside_the_references_at_a_lower_priority(tmp_path: Path, monkeypatch,
                                                                                 reference_workers: int):
    """The start order puts last time's slow kills first (a slow kill started late ends the matrix late); the
    matrix still lists the mutants as registered. Where the references have their own workers, the mutants'
    processes get :data:`selfcheck.MUTANT_NICENESS`, so the references' session keeps the cores."""
    registered = [impl for impl in impls.mutants("graphs") if impl.judged_on("emulated")]
    slow = [registered[len(registered) // 2], registered[-1]]
    selfcheck.write_hints(tmp_path, [selfcheck.Outcome("graphs", impl.name, "mutant", "killed", "suites/graphs/t.py::x",
                                                       30.0, "", "", 30.0, "emulated") for impl in slow])
    assert not (tmp_path / selfcheck.KILL_MATRIX_PATH).exists()  # the order comes from the hints cache
    started: list[tuple[str, int]] = []

    def fake_run_one(impl, *, niceness: int = 0, **_: object) -> selfcheck.Outcome:
        started.append((impl.name, niceness))
        return _run(impl.component, impl.name, impl.kind, "passed" if impl.kind == "reference" else "killed",
                    "" if impl.kind == "reference" else "suites/graphs/t.py::x")

    def fake_run_references(references, **_: object) -> list[selfcheck.Outcome]:
        return [_run(reference.component, "reference", "reference", "passed", "") for reference in references]

    monkeypatch.setattr(selfcheck, "reference_workers", lambda: reference_workers)
    monkeypatch.setattr(selfcheck, "run_references", fake_run_references)
    monkeypatch.setattr(selfcheck, "run_one", fake_run_one)
    outcomes = selfcheck.run_selfcheck(components=["graphs"], graph_backend="emulated", device="cpu", jobs=1,
                                       root=tmp_path, fork_server=False)
    mutants_started = [(name, niceness) for name, niceness in started if name != "reference"]
    expected_start = slow + [i for i in registered if i not in slow]
    assert [name for name, _ in mutants_started] == [impl.name for impl in expected_start]
    reported = [o.spec for o in outcomes if o.kind == "mutant" and o.verdict != "skipped"]
    assert reported == [impl.name for impl in registered]
    expected_niceness = selfcheck.MUTANT_NICENESS if reference_workers > 1 else 0
    assert {niceness for _, niceness in mutants_started} == {expected_niceness}
    if reference_workers == 1:
        assert ("reference", 0) in started  # a reference in the mutants' slots keeps its priority


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no process priorities on this platform")
def test_lower_priority_adds_to_the_nice_value_of_a_process_and_its_children():
    from harness.plugin.child_runs import lower_priority

    own_nice = "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; sys.stdin.readline(); " + own_nice + "; "
                              f"subprocess.run([sys.executable, '-c', {own_nice!r}])"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        before = os.getpriority(os.PRIO_PROCESS, child.pid)
        lower_priority(child.pid, 3)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == min(19, before + 3)
    finally:
        output, _ = child.communicate("\n", timeout=60)
    assert output.split() == [str(min(19, before + 3))] * 2, "the process, then the child it started"
    lower_priority(child.pid, 3)  # a process that has ended: nothing to do, no error


def test_a_mutant_hinted_on_another_backend_runs_that_test_first():
    hints = {("graphs", "mutant:a", "cuda"): "suites/graphs/t.py::x",
             ("graphs", "mutant:a", "emulated"): "suites/graphs/t.py::y",
             ("graphs", "mutant:new", "emulated"): "suites/graphs/t.py::z"}
    assert selfcheck.hinted_test(hints, "graphs", "mutant:a", "cuda") == "suites/graphs/t.py::x"  # its own first
    assert selfcheck.hinted_test(hints, "graphs", "mutant:new", "cuda") == "suites/graphs/t.py::z"
    assert selfcheck.hinted_test(hints, "gather", "mutant:new", "cuda") == ""  # another component's is not its


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
    from harness import impls
    from harness.selfcheck import kill_matrix

    ran: list[str] = []

    def fake_run_one(impl, **_: object) -> selfcheck.Outcome:
        ran.append(impl.name)
        verdict = "passed" if impl.kind == "reference" else "killed"
        return selfcheck.Outcome(impl.component, impl.name, impl.kind, verdict, "suites/graphs/t.py::x", 1.0, "",
                                 impl.bug, 0.5, "emulated")

    monkeypatch.setattr(selfcheck, "run_one", fake_run_one)
    # References in the mutants' slots, as on a small machine: every run goes through run_one.
    monkeypatch.setattr(selfcheck, "reference_workers", lambda: 1)
    outcomes = selfcheck.run_selfcheck(components=["graphs"], graph_backend="emulated", device="cpu", jobs=1,
                                       root=tmp_path)
    cuda_only = {impl.name for impl in impls.mutants("graphs") if impl.backends == {"cuda"}}
    assert "mutant:warm-up-skipped" in cuda_only
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


# Two one-file "suites" under a scratch root: run_references runs <root>/suites/<component> for each.
def _suites_root(tmp_path: Path, *, gather_test: str, graphs_test: str) -> Path:
    for component, body in (("gather", gather_test), ("graphs", graphs_test)):
        (tmp_path / "suites" / component).mkdir(parents=True)
        (tmp_path / "suites" / component / f"test_{component}_tiny.py").write_text(body)
    return tmp_path


def _references(*names: str) -> list:
    return [impls.implementations(name)["reference"] for name in names]


PASSES = "def test_passes():\n    assert 1 + 1 == 2\n"
FAILS = "def test_fails():\n    assert 1 + 1 == 3\n"


SLOW = "import time\n\ndef test_slow():\n    time.sleep(0.5)\n\n"


# One session of both tiny suites, on one process and on two xdist workers (each a process importing torch and
# the harness): each reference is judged by its own suite's failures and keeps its own suite's slowest tests.
@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-xdist-workers"])
def test_references_in_one_session_are_judged_by_their_own_suites(tmp_path: Path, workers: int):
    root = _suites_root(tmp_path, gather_test=FAILS, graphs_test=SLOW + PASSES)
    gather, graphs = selfcheck.run_references(
        _references("gather", "graphs"), workers=workers, graph_backend="emulated", device="cpu", root=root,
        environment=selfcheck.child_environment(threads=1), test_timeout=None, process_timeout=300)
    assert (gather.component, gather.verdict) == ("gather", "failed"), gather
    assert gather.failures == ("suites/gather/test_gather_tiny.py::test_fails",), gather
    assert (graphs.component, graphs.verdict, graphs.failures) == ("graphs", "passed", ()), graphs
    # One session: one time for both; each names the command that reproduces its own suite.
    assert gather.seconds == graphs.seconds > 0
    assert "suites/gather" in gather.command and "suites/graphs" in graphs.command
    # Each reference keeps its own suite's tests, slowest first (seconds of setup, call and teardown).
    assert [nodeid for nodeid, _ in graphs.slowest_tests] == [
        "suites/graphs/test_graphs_tiny.py::test_slow", "suites/graphs/test_graphs_tiny.py::test_passes"]
    assert graphs.slowest_tests[0][1] >= 0.5 > graphs.slowest_tests[1][1]
    assert [nodeid for nodeid, _ in gather.slowest_tests] == ["suites/gather/test_gather_tiny.py::test_fails"]
    table = selfcheck.format_matrix([gather, graphs])
    assert re.search(r"^slowest tests of the references: suites/graphs/test_graphs_tiny\.py::test_slow \(\d+\.\d s\), ",
                     table, re.MULTILINE), table


def test_a_failure_in_no_references_suite_fails_every_reference(tmp_path: Path):
    root = _suites_root(tmp_path, gather_test=PASSES, graphs_test=PASSES)
    (root / "elsewhere").mkdir()
    (root / "elsewhere" / "test_stray.py").write_text(FAILS)
    outcomes = selfcheck.run_references(
        _references("gather", "graphs"), workers=1, graph_backend="emulated", device="cpu", root=root,
        environment=selfcheck.child_environment(threads=1), extra_args=[str(root / "elsewhere")],
        test_timeout=None, process_timeout=300)
    assert [(o.verdict, o.first_failure) for o in outcomes] == [
        ("failed", "elsewhere/test_stray.py::test_fails")] * 2, outcomes


def test_references_share_one_session_beside_the_mutants(tmp_path: Path, monkeypatch):
    sessions: list[list[str]] = []

    def fake_run_references(references, *, workers, **_: object) -> list[selfcheck.Outcome]:
        sessions.append([reference.component for reference in references] + [f"workers={workers}"])
        return [_run(reference.component, "reference", "reference", "passed", "") for reference in references]

    def fake_run_one(impl, **_: object) -> selfcheck.Outcome:
        assert impl.kind == "mutant", f"{impl.name} ran alone: references share one session beside the mutants"
        return _run(impl.component, impl.name, "mutant", "killed", f"suites/{impl.component}/t.py::x")

    monkeypatch.setattr(selfcheck, "reference_workers", lambda: 3)
    monkeypatch.setattr(selfcheck, "run_references", fake_run_references)
    monkeypatch.setattr(selfcheck, "run_one", fake_run_one)
    finished = []
    outcomes = selfcheck.run_selfcheck(components=["graphs", "gather"], graph_backend="emulated", device="cpu",
                                       jobs=1, root=tmp_path, fork_server=False,
                                       test_timeout=None, process_timeout=1, on_finished=finished.append)
    assert sessions == [["graphs", "gather", "workers=6"]]
    # Every run is announced as it ends, the references one by one: a matrix stopped from outside says what ended.
    assert sorted((o.component, o.spec) for o in finished) == sorted(
        (o.component, o.spec) for o in outcomes if o.verdict != "skipped")
    assert [o.component for o in outcomes if o.kind == "reference"] == ["graphs", "gather"]
    # Every mutant judged here went through run_one (the cuda-only ones are skipped on this backend).
    assert {o.verdict for o in outcomes if o.kind == "mutant"} == {"killed", "skipped"}


def test_children_get_the_callers_pythonpath_made_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The matrix's children run in the suites' root, not where the caller stood: a relative PYTHONPATH entry
    (an engine's module folder given as ``.`` or ``src``) must keep naming the caller's folder there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([".", "src"]))
    environment = selfcheck.child_environment()
    assert environment["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), str(tmp_path / "src")]


def test_a_matrix_stopped_from_outside_says_which_runs_were_in_flight_and_where(tmp_path: Path):
    """A CI step's limit stops the matrix with SIGTERM: it names each run still going, for how long, and the last
    test phase that run reported, then exits as the signal would (the progress lines only say what finished)."""
    root = Path(__file__).resolve().parent.parent
    # The matrix's temporary folders are made here, so that the report log of its first run shows it under way.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
                   "TMPDIR": str(scratch)}
    child = subprocess.Popen([sys.executable, "-m", "harness", "selfcheck", "--component", "gather", "--jobs", "1",
                              "--no-fork-server", "--keep-hints"], cwd=root, env=environment,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The reference's run is in flight once its pytest has written a test phase to its report log: the first
        # log of the matrix, where the reference runs in the mutants' one slot (first), and otherwise beside them,
        # started before them (selfcheck.run_selfcheck). Waited for, however long the machine takes; the bound only
        # ends a matrix that never gets there.
        deadline = time.monotonic() + 480  # within the test's own limit (600 s), to say which step never came
        while not any(child_runs.phase_reports(child_runs.read_report_log(log))
                      for log in scratch.glob("*/reports.jsonl")):
            assert time.monotonic() < deadline, "no run of the matrix reported a test phase within 480 s"
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=0.2)  # the poll's pace; a matrix that ended first is a failure
                stdout, stderr = child.communicate()
                pytest.fail(f"the matrix ended (exit {child.returncode}) before any run was under way: "
                            f"{(stdout + stderr)[-2000:]}")
        child.terminate()
        stdout, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 128 + 15, stdout[-2000:] + stderr[-2000:]
    assert "selfcheck: stopped from outside (SIGTERM)" in stderr, stderr[-2000:]
    assert re.search(r"still running after \d+ s: gather reference; (last reported: suites/gather/\S+ \w+ \w+|"
                     r"no test phase reported yet)", stderr), stderr[-2000:]
