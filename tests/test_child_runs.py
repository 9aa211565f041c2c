"""Child pytest runs (selfcheck, conformance) read the project's ini file wherever their report log lies.

pytest looks for the ini file before it loads plugins, so a plugin option's value written as a separate word
(``--report-log PATH``) counts as a test path there: an existing report log outside the project (an xdist
worker starts after the controller has made it; a log left from an earlier run) moved the search above the
project, and with ``--rootdir`` given (as child commands give it) pytest does not search again from the test
paths, so the project's ini was not read (on the H200 the reference's conformance run found no tests: the workers
refused ``--impl``, which only the ini's ``-p harness.plugin`` declares in an uninstalled checkout)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import conformance, impls, selfcheck
from harness.plugin import child_runs

ROOT = Path(__file__).resolve().parents[1]

INI_TEST = '''
from pathlib import Path

def check_the_ini_is_read(request):  # collected only under the ini's python_functions
    assert request.config.inipath == Path(__file__).parent / "pyproject.toml", request.config.inipath
'''


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "xdist"])
def test_a_child_reads_the_project_ini_with_its_report_log_elsewhere(tmp_path: Path, workers: int):
    project, elsewhere = tmp_path / "project", tmp_path / "logs"
    project.mkdir(), elsewhere.mkdir()
    (project / "pyproject.toml").write_text('[tool.pytest.ini_options]\npython_functions = ["check_*"]\n')
    (project / "test_ini.py").write_text(INI_TEST)
    log = elsewhere / "reports.jsonl"
    log.write_text("")  # as an xdist worker finds it, and a rerun into the same folder
    command = child_runs.pytest_command([project / "test_ini.py"], root=project, plugin="harness.selfcheck.plugin",
                                        report_log=log,
                                        arguments=[f"--numprocesses={workers}"] if workers else [])
    finished = child_runs.run(command, cwd=project, environment=child_runs.child_environment(), time_limit=120)
    assert finished.returncode == 0, finished.output
    outcomes = [entry["outcome"] for entry in child_runs.phase_reports(child_runs.read_report_log(log))
                if entry["when"] == "call"]
    assert outcomes == ["passed"], finished.output


class _Built(Exception):
    """Stops a run once its child command is built."""


def _separate_values(command: list[str]) -> list[tuple[str, str]]:
    """The options of ``command`` (after ``python -m pytest PATH...``) followed by a separate value word."""
    words = command[3:]
    words = words[next(index for index, word in enumerate(words) if word.startswith("-")):]
    return [(option, value) for option, value in zip(words, words[1:])
            if option.startswith("-") and not value.startswith("-")]


def test_the_selfcheck_and_conformance_children_join_every_option_value(monkeypatch):
    """The commands as the kill matrix and the conformance command build them: a separate word after an option
    is only ever a plugin's name (``-p``, which pytest reads before the ini)."""
    built = []
    original = child_runs.pytest_command

    def pytest_command(*arguments, **options):
        built.append(original(*arguments, **options))
        raise _Built

    monkeypatch.setattr(child_runs, "pytest_command", pytest_command)
    with pytest.raises(_Built):
        conformance.run_conformance(component="graphs", spec="reference", device="cpu", graph_backend="emulated",
                                    root=ROOT, jobs=2)
    reference = impls.load("graphs", "reference", graph_backend="emulated")
    with pytest.raises(_Built):
        selfcheck._run_together([reference], first="", fork_server=None, workers=2, graph_backend="emulated",
                                device="cpu", root=ROOT, environment={}, extra_args=None, test_timeout=30,
                                process_timeout=None)
    assert len(built) == 2
    for command in built:
        assert {option for option, _ in _separate_values(command)} == {"-p"}, command


def test_why_a_child_did_not_run_names_its_first_error_line_and_its_last_lines():
    """What the kill matrix's "error" verdict and the conformance command's one-line error quote."""
    output = "\n".join(["bringing up nodes...", "-c: error: unrecognized arguments: --impl graphs=reference",
                        *["  frame"] * 20, "", "no tests ran in 3.00s", ""])
    assert child_runs.why_it_did_not_run(output, last=1) == [
        "-c: error: unrecognized arguments: --impl graphs=reference", "no tests ran in 3.00s"]
    assert child_runs.why_it_did_not_run("a\nERROR: file or directory not found: x\n", last=3) == [
        "a", "ERROR: file or directory not found: x"]  # the error line among the last ones: once
    assert child_runs.why_it_did_not_run("  \n", last=3) == ["(no output)"]
