"""python -m harness conformance: per-clause verdicts from the suite's outcomes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli, conformance
from harness.conformance import clauses
from harness.conformance.clauses import CORE, STRICT, Clause, DocumentedAway
from harness.errors import HarnessError
from harness.plugin import child_runs

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent

TABLE = (Clause("toy", "stale", CORE, "no stale reads"), Clause("toy", "cast", CORE, "no silent cast"),
         Clause("toy", "warm", CORE, "warm-up outside"), Clause("toy", "raises", STRICT, "raises ReplayError"),
         Clause("toy", "reentrant", STRICT, "refuses nesting"))


STALE_READ = ("harness.errors.MismatchError: toy: observably different from eager (harness.oracle):\n"
              "  values: tensors differ at ['replay()'] (exact): 3 / 8 elements mismatch (37.5%)\n"
              "  implementations: {'toy': 'mutant:x'}\n  backend: emulated")


def _records() -> list[dict]:
    collected = [{"collected": f"suites/toy/test_a.py::test_{n}", "clause": c}
                 for n, c in [("1", "stale"), ("2", "stale"), ("3", "cast"), ("4", "warm"), ("5", "raises"),
                              ("6", None)]]

    def phase(n, when, outcome, clause, **extra):
        return {"nodeid": f"suites/toy/test_a.py::test_{n}", "when": when, "outcome": outcome, "clause": clause,
                **extra}

    return collected + [
        phase("1", "setup", "passed", "stale"), phase("1", "call", "passed", "stale"),
        phase("2", "setup", "passed", "stale"), phase("2", "call", "passed", "stale"),
        phase("2", "teardown", "failed", "stale", message=STALE_READ, example="", reproduce="pytest x"),
        phase("3", "setup", "passed", "cast"), phase("3", "call", "passed", "cast"),
        phase("4", "setup", "skipped", "warm", reason="Skipped: the emulated backend does not model warm-up"),
        phase("5", "setup", "passed", "raises"),
        phase("5", "call", "failed", "raises", message="RuntimeError: not ReplayError\nmore",
              example="Falsifying example: test_5(seed=3)", reproduce="pytest y --reproduce-failure 1:AA"),
        phase("6", "setup", "passed", None), phase("6", "call", "passed", None),
    ]


def _report() -> conformance.ConformanceReport:
    return conformance.build_report(_records(), TABLE, component="toy", spec="mutant:x", kind="mutant", engine="",
                                    device="cpu", graph_backend="emulated", environment={"torch": "2"},
                                    command="pytest suites/toy")


def test_each_clause_gets_its_verdict_core_first():
    report = _report()
    verdicts = {r.clause: (r.verdict, r.passed, r.failed, r.skipped) for r in report.results}
    assert verdicts == {"stale": ("violated", 1, 1, 0), "cast": ("held", 1, 0, 0), "warm": ("not run", 0, 0, 1),
                        "raises": ("violated", 0, 1, 0), "reentrant": ("no test", 0, 0, 0)}
    assert [r.tier for r in report.results] == [CORE, CORE, CORE, STRICT, STRICT]
    stale = report.results[0]
    assert stale.first_failure == {"nodeid": "suites/toy/test_a.py::test_2", "when": "teardown",
                                   "message": STALE_READ, "example": "", "reproduce": "pytest x"}
    assert report.results[2].skip_reason == "the emulated backend does not model warm-up"
    assert report.unclassified == ["suites/toy/test_a.py::test_6"] and not report.ok


def test_headlines_name_core_violations_first_and_say_all_held_otherwise():
    report = _report()
    assert report.headline(CORE) == "core: VIOLATED (results can be wrong): stale (wrong values)"
    assert report.headline(STRICT) == "strict: VIOLATED: raises (loud refusal)"
    held = conformance.build_report([r for r in _records() if r.get("nodeid", r.get("collected")).endswith(("_1",
                                     "_3", "_4"))], TABLE, component="toy", spec="reference", kind="reference",
                                    engine="", device="cpu", graph_backend="emulated", environment={}, command="")
    assert held.headline(CORE).startswith("core: all held (2 clauses); not run here: warm (the emulated backend")
    text = conformance.format_text(report)
    assert text.splitlines()[1] == report.headline(CORE) and "reproduce raises: pytest y --reproduce-failure" in text


def test_markdown_and_json_carry_the_first_falsifying_example(tmp_path):
    markdown, document = conformance.write_report(_report(), tmp_path)
    assert markdown.name == "conformance-toy-mutant_x.md" and document.name == "conformance-toy-mutant_x.json"
    text = markdown.read_text()
    assert "**core: VIOLATED (results can be wrong): stale (wrong values)**" in text
    assert ("| strict | `raises` | **violated**: loud refusal | 0/1 | `test_a.py::test_5`: RuntimeError: not "
            "ReplayError |") in text
    assert "| F1 | wrong values | values: tensors differ at ['replay()'] | 1 | `stale` (1) |" in text
    assert "Falsifying example: test_5(seed=3)" in text and "pytest y --reproduce-failure 1:AA" in text
    data = json.loads(document.read_text())
    assert data["summary"]["core_violations"] == ["stale"] and data["summary"]["strict_violations"] == ["raises"]


AWAY = (DocumentedAway("stale", quote="Reads after a replay see capture-time values.", where="toy.py, ToyGraph",
                       note="the toy engine never refreshes"),)


def test_a_clause_the_engine_documents_away_is_neither_held_nor_violated(tmp_path):
    report = conformance.build_report(_records(), TABLE, documented_away=AWAY, component="toy", spec="toy",
                                      kind="adapter", engine="toy 1.0", device="cpu", graph_backend="emulated",
                                      environment={}, command="pytest suites/toy")
    stale = report.results[0]
    # its tests' outcomes are kept, shown but not judged
    assert (stale.clause, stale.verdict, stale.passed, stale.failed) == ("stale", "documented away", 1, 1)
    assert stale.first_failure is None and [f["nodeid"] for f in stale.failures] == ["suites/toy/test_a.py::test_2"]
    assert stale.documented == {"clause": "stale", "quote": "Reads after a replay see capture-time values.",
                                "where": "toy.py, ToyGraph", "note": "the toy engine never refreshes"}
    assert report.headline(CORE) == ("core: all held (1 clauses); documented away by the engine: stale; not run here: "
                                     "warm (the emulated backend does not model warm-up)")
    assert report.headline(STRICT) == "strict: VIOLATED: raises (loud refusal)"  # the others judged as before
    text = conformance.format_text(report)
    assert ('documented away stale: "Reads after a replay see capture-time values." (toy.py, ToyGraph); the toy '
            'engine never refreshes') in text
    assert "reproduce stale" not in text and "reproduce raises" in text
    markdown, document = conformance.write_report(report, tmp_path)
    written = markdown.read_text()
    assert ("| core | `stale` | documented away | 1/2 | the engine's documentation: \"Reads after a replay see "
            "capture-time values.\" |") in written
    assert "### Documented away by the engine" in written
    assert "> Reads after a replay see capture-time values." in written
    assert "toy.py, ToyGraph. the toy engine never refreshes" in written and "1 passed, 1 failed, 0 skipped" in written
    assert "#### `stale`" not in written.split("### Documented away")[0]  # not listed among the violations
    data = json.loads(document.read_text())
    assert data["summary"]["documented_away"] == ["stale"] and data["summary"]["core_violations"] == []


def test_a_report_whose_only_failures_are_documented_away_is_ok():
    records = [r for r in _records() if r.get("clause") in ("stale", "cast")]
    report = conformance.build_report(records, TABLE, documented_away=AWAY, component="toy", spec="toy",
                                      kind="adapter", engine="", device="cpu", graph_backend="emulated",
                                      environment={}, command="")
    assert report.ok and not report.violations(CORE)


def _outside_records() -> list[dict]:
    """``cast``: one test passes, one fails outside the engine's contract, one fails stepping outside a clause
    the engine does not document away; ``warm``: its only test fails outside the contract; ``stale`` (documented
    away): its own failing test stepped outside it too."""
    def test(n, clause, outcome, outside=(), stand_ins=()):
        nodeid = f"suites/toy/test_b.py::test_{n}"
        extra = {"message": f"AssertionError: test {n}", "example": "", "reproduce": ""} if outcome == "failed" else {}
        return [{"collected": nodeid, "clause": clause},
                {"nodeid": nodeid, "when": "setup", "outcome": "passed", "clause": clause,
                 **({"stand_ins": list(stand_ins)} if stand_ins else {})},
                {"nodeid": nodeid, "when": "call", "outcome": outcome, "clause": clause,
                 **({"outside_contract": list(outside)} if outside else {}), **extra}]

    return [*test(1, "cast", "passed", ["stale"], stand_ins=["toy.weak_ref (Python, for a compiled op)"]),
            *test(2, "cast", "failed", ["stale"], stand_ins=["toy.weak_ref (Python, for a compiled op)"]),
            *test(3, "warm", "failed", ["stale"]), *test(4, "stale", "failed", ["stale"]),
            *test(5, "raises", "failed", ["reentrant"], stand_ins=["toy.bindings"]),
            *test(6, "raises", "passed")]


def test_a_failure_outside_the_engines_documented_contract_is_not_counted_against_its_clause(tmp_path):
    report = conformance.build_report(_outside_records(), TABLE, documented_away=AWAY, component="toy", spec="toy",
                                      kind="adapter", engine="toy 1.0", device="cpu", graph_backend="emulated",
                                      environment={}, command="pytest suites/toy")
    rows = {r.clause: (r.verdict, r.passed, r.failed, [f["nodeid"][-6:] for f in r.outside], r.outside_of)
            for r in report.results}
    assert rows == {
        "cast": ("held", 1, 0, ["test_2"], ["stale"]),  # judged by the test that kept to the contract
        "warm": ("not judged", 0, 0, ["test_3"], ["stale"]),  # nothing else ran
        "stale": ("documented away", 0, 1, [], []),  # the documented-away clause's own tests: as before
        "raises": ("violated", 1, 1, [], []),  # "reentrant" is not documented away: the failure counts
        "reentrant": ("no test", 0, 0, [], []),
    }
    assert report.headline(CORE).startswith("core: all held (1 clauses); documented away by the engine: stale; "
                                            "not run here: warm (its 1 failing tests used the engine outside")
    markdown, _ = conformance.write_report(report, tmp_path)
    written = markdown.read_text()
    assert "| core | `cast` | held (rests on stand-ins) | 1/1 (+1 outside the contract) |" in written
    assert "### Failed outside the engine's documented contract" in written
    assert "#### `warm` (core): 1 tests outside `stale`" in written
    assert "- `test_b.py::test_3`: AssertionError: test 3" in written
    # the stand-ins a clause's counted tests reached, from any phase: a test listed outside the contract is not
    # counted, so "cast" rests on one of its one counted test's stand-ins, "raises" on one of two
    stand = {r.clause: (r.on_stand_ins, r.stand_ins) for r in report.results if r.stand_ins}
    assert stand == {"cast": (1, ["toy.weak_ref (Python, for a compiled op)"]), "raises": (1, ["toy.bindings"])}
    assert "| strict | `raises` | **violated**: wrong state left behind (rests on stand-ins) | 1/2 |" in written
    assert "### Verdicts that rest on stand-ins" in written
    assert "- `cast` (1 of 1 tests): toy.weak_ref (Python, for a compiled op)" in written
    assert "rests on stand-ins: raises (1 of 2 tests): toy.bindings" in conformance.format_text(report)


def test_a_run_records_what_adapters_and_stand_ins_say_of_each_test(pytester):
    pytester.makepyfile(test_toy="""
        from harness.conformance.clauses import outside_contract, rests_on_stand_in

        def test_outside():
            outside_contract("write-back")
            outside_contract("write-back")
            rests_on_stand_in("engine.weak_ref")
            assert False

        def test_within():
            pass
    """)
    pytester.runpytest("-p", "harness.conformance.plugin", "-p", "no:cacheprovider",
                       "--report-log", "log.jsonl").assert_outcomes(passed=1, failed=1)
    calls = {(entry["nodeid"].rpartition("::")[2]): dict(entry["user_properties"])
             for entry in map(json.loads, (pytester.path / "log.jsonl").read_text().splitlines())
             if entry.get("when") == "call"}
    assert calls["test_outside"]["outside_contract"] == ["write-back"]
    assert calls["test_outside"]["stand_ins"] == ["engine.weak_ref"]
    assert "outside_contract" not in calls["test_within"] and "stand_ins" not in calls["test_within"]  # cleared


def test_documenting_away_a_clause_the_table_lacks_is_refused():
    with pytest.raises(HarnessError, match="documented away: stael is not a clause of this component"):
        conformance.build_report(_records(), TABLE, documented_away=(DocumentedAway("stael", "q", "w"),),
                                 component="toy", spec="toy", kind="adapter", engine="", device="cpu",
                                 graph_backend="emulated", environment={}, command="")


def test_every_failing_test_of_a_violated_clause_is_listed(tmp_path):
    records = _records() + [
        {"collected": "suites/toy/test_a.py::test_7", "clause": "stale"},
        {"nodeid": "suites/toy/test_a.py::test_7", "when": "call", "outcome": "failed", "clause": "stale",
         "message": "AssertionError: 3 of 8 elements differ\ndetail", "example": "", "reproduce": "pytest z"}]
    report = conformance.build_report(records, TABLE, component="toy", spec="mutant:x", kind="mutant", engine="",
                                      device="cpu", graph_backend="emulated", environment={}, command="")
    stale = report.results[0]
    assert (stale.failed, [f["nodeid"] for f in stale.failures]) == (
        2, ["suites/toy/test_a.py::test_2", "suites/toy/test_a.py::test_7"])
    assert stale.first_failure == stale.failures[0]
    markdown, document = conformance.write_report(report, tmp_path)
    assert ("Every failing test of `stale`:\n\n- `test_a.py::test_2`: harness.errors.MismatchError: toy: observably "
            "different from eager (harness.oracle):\n"
            "- `test_a.py::test_7`: AssertionError: 3 of 8 elements differ\n") in markdown.read_text()
    assert "Every failing test of `raises`" not in markdown.read_text()  # one failure: nothing to add
    assert len(json.loads(document.read_text())["results"][0]["failures"]) == 2


def test_a_run_of_a_mutant_reports_the_clause_it_breaks(tmp_path, request):
    """End to end on part of the graphs suite: the child pytest, the plugin's records, the verdicts."""
    report = conformance.run_conformance(
        component="graphs", spec="mutant:structure-change-accepted", device="cpu", graph_backend="emulated",
        root=ROOT, extra_args=["-k", "output_change_at_replay or counts_and_names or warm_up"])
    verdicts = {r.clause: r.verdict for r in report.results}
    assert verdicts["changes-raise"] == "violated" and verdicts["accounting"] == "held"
    assert verdicts["warm-up"] == "not run" and verdicts["live-breaks"] == "no test"
    failure = next(r for r in report.results if r.clause == "changes-raise").first_failure
    assert "test_break_output_change_at_replay_raises_then_recovers" in failure["nodeid"]
    assert failure["message"] and "--impl graphs=mutant:structure-change-accepted" in failure["reproduce"]
    # the mutant accepts the change silently: no test saw the values go wrong, so the report does not say they can
    assert report.headline(CORE) == ("core: VIOLATED (no test saw wrong values): changes-raise (wrong state left "
                                     "behind)")
    # A line for a committed report: nothing of this machine's checkout or interpreter in it, the test named as
    # installed suites have it (a wheel has no ./suites), and run from a checkout it reproduces the failure.
    assert str(ROOT) not in failure["reproduce"] and sys.executable not in failure["reproduce"]
    assert "python -m pytest --pyargs 'harness.suites.graphs." in failure["reproduce"]
    assert "--rootdir" not in failure["reproduce"]
    request.getfixturevalue("installed_suites")  # the rerun below names them so
    rerun = subprocess.run(failure["reproduce"], shell=True, cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                                                       os.environ.get("PATH", "")])})
    assert rerun.returncode == 1 and "1 failed" in rerun.stdout, rerun.stdout[-3000:] + rerun.stderr[-2000:]


def test_a_run_of_a_runner_mutant_reports_the_clause_it_breaks():
    """End to end on part of the runner suite: a runner whose forward stays patched after a BaseException."""
    report = conformance.run_conformance(
        component="runner", spec="mutant:restore-on-exception-only", device="cpu", graph_backend="emulated",
        root=ROOT, extra_args=["-k", "test_forward_restored_after or test_bad_buckets_are_refused"])
    rows = {r.clause: (r.verdict, r.passed, r.failed) for r in report.results}
    assert rows["forward-restored"] == ("violated", 2, 1) and rows["bucket-errors"] == ("held", 3, 0)
    assert rows["replay-equals-eager"] == ("no test", 0, 0) and not report.unclassified
    failure = next(r for r in report.results if r.clause == "forward-restored").first_failure
    assert failure["nodeid"].endswith("test_forward_restored_after_an_error_and_runner_still_usable[BaseException]")
    assert "--impl runner=mutant:restore-on-exception-only" in failure["reproduce"]
    assert report.headline(CORE) == ("core: VIOLATED (no test saw wrong values): forward-restored (wrong state left "
                                     "behind)")


# The first reproduce line as the H200 recorded it in docs/conformance/sglang-0.5.23-gather.md, before lines were
# made portable; the second with a virtual environment's site-packages on PYTHONPATH.
H200_LINES = [
    "PYTHONPATH=/work/main/.sglang:/work/main:/tmp/gpu-site:/tmp/gpu-site:/work/main /opt/torch/.venv/bin/python3 -m "
    "pytest '/work/main/suites/gather/test_contract.py::test_matches_eager_oracle_over_the_contract[hidden]' "
    "--rootdir /work/main --device cuda --graph-backend cuda --impl gather=sglang --hypothesis-profile ci "
    "--reproduce-failure 6.168.3:AEEBQgFCQQRBBUEEQQtBAUECQQZBAkEBQQNBA0EEQQBBAkIMpEEAQQE=",
    "PYTHONPATH=/tmp/gpu-site:/opt/torch/.venv/lib/python3.12/site-packages /opt/torch/.venv/bin/python3 -m pytest "
    "'/work/main/suites/gather/test_contract.py::test_strided_and_offset_sources[row-strided]' --rootdir /work/main "
    "--device cuda --graph-backend cuda --impl gather=sglang --hypothesis-profile ci",
]


def test_a_report_built_from_host_paths_has_none_left(tmp_path):
    """_portable, as run_conformance applies it: the interpreter, site folders and the checkout leave the report."""
    lines = [conformance._portable(line, Path("/work/main")) for line in H200_LINES]
    assert lines[0] == (
        "PYTHONPATH=.sglang:.${PYTHONPATH:+:$PYTHONPATH} python -m pytest --pyargs "
        "'harness.suites.gather.test_contract::test_matches_eager_oracle_over_the_contract[hidden]' --device cuda "
        "--graph-backend cuda --impl gather=sglang --hypothesis-profile ci "
        "--reproduce-failure 6.168.3:AEEBQgFCQQRBBUEEQQtBAUECQQZBAkEBQQNBA0EEQQBBAkIMpEEAQQE=")
    assert lines[1].startswith("python -m pytest --pyargs 'harness.suites.gather.test_contract::test_strided_")
    records = [{"collected": f"suites/toy/test_a.py::test_{n}", "clause": "stale"} for n in (1, 2)]
    records += [{"nodeid": f"suites/toy/test_a.py::test_{n}", "when": "call", "outcome": "failed", "clause": "stale",
                 "message": "MismatchError", "example": "", "reproduce": line} for n, line in zip((1, 2), lines)]
    report = conformance.build_report(records, TABLE, component="toy", spec="sglang", kind="adapter", engine="",
                                      device="cuda", graph_backend="cuda", environment={}, command="pytest suites/toy")
    markdown, document = conformance.write_report(report, tmp_path)
    for written in (markdown.read_text(), document.read_text(), conformance.format_text(report)):
        for host_path in ("/opt/torch", "/tmp/gpu-site", "/work/main", "site-packages", "--rootdir"):
            assert host_path not in written
        assert "python -m pytest --pyargs 'harness.suites.gather.test_contract::" in written


@pytest.mark.parametrize(("readers_path", "expected"), [(None, "sub:."), ("", "sub:."), ("/carried", "sub:.:/carried")])
def test_a_portable_line_keeps_the_readers_own_pythonpath(readers_path, expected):
    """A GPU job that carries its wheels on PYTHONPATH must still import them when it pastes a report's line."""
    line = conformance._portable("PYTHONPATH=/repo/sub:/repo:/tmp/gpu-site /venv/bin/python -m pytest t.py",
                                 Path("/repo"))
    prefix = line.split(" python -m pytest ")[0]
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if readers_path is not None:
        environment["PYTHONPATH"] = readers_path
    shown = subprocess.run(["sh", "-c", f'{prefix} sh -c \'printf %s "$PYTHONPATH"\''], env=environment,
                           capture_output=True, text=True, check=True)
    assert shown.stdout == expected


def test_a_wheels_suites_are_named_as_installed():
    """In a wheel the suites' root is the installed package: the same --pyargs name."""
    package = "/venv/lib/python3.11/site-packages/harness"
    line = conformance._portable(f"PYTHONPATH=/home/me/engine /venv/bin/python -m pytest {package}/suites/graphs/"
                                 f"test_programs.py::test_x --rootdir {package} --device cpu", Path(package))
    assert line == "python -m pytest --pyargs harness.suites.graphs.test_programs::test_x --device cpu"


def test_a_bad_spec_is_one_line_before_any_suite_runs(capsys):
    assert cli.main(["conformance", "--impl", "graphs=mutant:nope"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_component_without_clauses_is_refused(capsys, monkeypatch):
    # Every component of the table declares its clauses (tests/test_clauses.py); one added without them is refused
    # before its suite runs.
    monkeypatch.delitem(clauses.CLAUSES, "runner")
    assert cli.main(["conformance", "--impl", "runner=reference"]) == 2
    assert "no contract clauses are declared for 'runner'" in capsys.readouterr().err


def test_a_suite_past_its_time_limit_is_stopped_with_its_workers_and_the_report_says_so(tmp_path):
    import os
    import sys
    import time

    started = time.monotonic()
    child = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
             "print('started', flush=True); time.sleep(60)")
    finished = child_runs.run([sys.executable, "-c", child], cwd=ROOT, environment=dict(os.environ), time_limit=3)
    assert finished.returncode is None and "started" in finished.output and time.monotonic() - started < 30
    report = _report()
    report.stopped = "stopped at the time limit of 3 s"
    assert not report.ok and "INCOMPLETE: stopped at the time limit" in conformance.format_text(report)
    assert "**incomplete**: stopped" in conformance.format_markdown(report)


def test_the_suites_child_gets_a_pythonpath_that_names_the_folder_it_was_given_in(monkeypatch, tmp_path):
    """The child pytest runs in the suites' root: PYTHONPATH=. of the engine's folder must still name that folder."""
    started = []

    def run(command, *, cwd, environment, time_limit):
        started.append(environment)
        return child_runs.ChildRun(2, "no tests ran", 0.0)

    monkeypatch.setattr(child_runs, "run", run)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([".", "src", *filter(None, [os.environ.get("PYTHONPATH")])]))
    with pytest.raises(conformance.HarnessError, match="the suite did not run"):
        conformance.run_conformance(component="graphs", spec="reference", device="cpu", graph_backend="emulated",
                                    root=ROOT)
    (environment,) = started
    assert environment["PYTHONPATH"].split(os.pathsep)[:2] == [str(tmp_path), str(tmp_path / "src")]


def test_a_bare_exception_from_an_engines_module_says_where_it_was_raised(pytester):
    """An engine's plain ``assert`` fails with no message: the report names the engine file and line instead, as
    a path from the folder it was imported from (no host folders)."""
    pytester.syspathinsert()
    pytester.makepyfile(engine_mod="""
        def end_segment(graph):
            assert graph is not None
    """)
    pytester.makepyfile(test_toy="""
        import engine_mod

        def test_bare():
            engine_mod.end_segment(None)

        def test_said():
            raise ValueError("the buffer moved")
    """)
    pytester.runpytest("-p", "harness.conformance.plugin", "-p", "no:cacheprovider", "-p", "no:assertion",
                       "--report-log", "log.jsonl").assert_outcomes(failed=2)
    calls = {(entry["nodeid"].rpartition("::")[2]): dict(entry["user_properties"])
             for entry in map(json.loads, (pytester.path / "log.jsonl").read_text().splitlines())
             if entry.get("when") == "call"}
    assert calls["test_bare"]["message"] == "AssertionError (raised at engine_mod.py:2)"
    assert calls["test_said"]["message"] == "ValueError: the buffer moved"


def test_a_suite_that_did_not_run_names_the_error_above_the_tail(monkeypatch):
    """An xdist worker's usage error is printed far above pytest's last lines ("no tests ran"): the one-line
    error carries it."""
    output = "\n".join(["bringing up nodes...", "[gw0] node down: Traceback (most recent call last):",
                        "pytest.UsageError: usage: -c [options] [file_or_dir] [file_or_dir] [...]",
                        "-c: error: unrecognized arguments: --impl graphs=reference", *["  frame"] * 40,
                        "replacing crashed worker gw0", "no tests ran in 32.05s"])
    monkeypatch.setattr(child_runs, "run", lambda command, **options: child_runs.ChildRun(5, output, 0.0))
    with pytest.raises(conformance.HarnessError) as raised:
        conformance.run_conformance(component="graphs", spec="reference", device="cpu", graph_backend="emulated",
                                    root=ROOT)
    message = str(raised.value)
    assert "pytest exit 5" in message and "unrecognized arguments: --impl graphs=reference" in message, message
    assert message.endswith("no tests ran in 32.05s") and "\n" not in message, message
