"""An engine's own goldens (issue 33, item 1): ``--golden-dir=PATH`` or the ini's ``harness_golden_dir`` moves
where the suites' goldens are read and written; ``--snapshot-update`` never writes into an installed harness; a
failed golden's hint names the folder that holds it; a golden compares only what the contract fixes (the capture
plan's "at least")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# As in test_golden.py: imported outside pytester's in-process runs, which restore sys.modules after each.
import hypothesis  # noqa: F401
import pytest

# the demo suite of the golden tests: one snapshot of a tensor and a plan
from test_golden import _SUITE

from harness.runner.candidate import fixed_capture_plan

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = "demo/test_demo/test_logits[0.0].json"  # below a golden folder, mirroring suites/

_CONFTEST_HEAD = '''
import os
from pathlib import Path

if os.environ.get("SIMULATE_WHEEL"):  # the harness as a wheel installs it: its goldens inside the package
    from harness import locations

    locations.is_checkout = lambda: False
    if os.environ["SIMULATE_WHEEL"] == "here":  # and this project stands for the installed package
        locations.project_root = lambda: Path(__file__).resolve().parent
'''


@pytest.fixture
def project(golden_project):
    return golden_project(_SUITE, conftest_head=_CONFTEST_HEAD, addopts="--device cpu -p no:cacheprovider")


def _goldens(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.json")) if folder.is_dir() else []


@pytest.fixture
def change_the_suite(project, rewrite_module):
    """Makes the demo test pin another number than its golden holds."""
    return lambda: rewrite_module(project.path / "suites/demo/test_demo.py",
                                  _SUITE.replace('"segments": 3', '"segments": 4'))


def test_the_option_moves_reads_and_writes_to_the_engine_folder(project):
    project.runpytest("--snapshot-update", "--golden-dir=engine-goldens").assert_outcomes(passed=1)
    engine = project.path / "engine-goldens"
    assert _goldens(engine) == [GOLDEN]  # the suites' layout, below the engine's folder
    assert _goldens(project.path / "golden") == []  # the harness's folder is not written
    project.runpytest("--golden-dir=engine-goldens").assert_outcomes(passed=1)
    # read from there: the engine's copy pins another number, and the run fails on it
    path = engine / GOLDEN
    path.write_text(path.read_text().replace('"segments": 3', '"segments": 5'))
    result = project.runpytest(f"--golden-dir={engine}")  # absolute, as well
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(['*"segments": 3*'])


def test_the_ini_setting_is_relative_to_the_ini_file_and_the_option_wins(project, monkeypatch):
    project.makeini("[pytest]\ntestpaths = suites\naddopts = --device cpu -p no:cacheprovider\n"
                    "harness_golden_dir = tests/harness-goldens\n")
    elsewhere = project.mkdir("work")
    monkeypatch.chdir(elsewhere)  # relative to the ini file's folder, not to where pytest runs
    project.runpytest("--snapshot-update", "../suites").assert_outcomes(passed=1)
    assert _goldens(project.path / "tests/harness-goldens") == [GOLDEN]
    assert _goldens(elsewhere) == [] and _goldens(project.path / "golden") == []
    project.runpytest("../suites").assert_outcomes(passed=1)
    # the option, relative to the invocation folder, wins over the ini
    project.runpytest("--snapshot-update", "--golden-dir=mine", "../suites").assert_outcomes(passed=1)
    assert _goldens(elsewhere / "mine") == [GOLDEN]


def test_a_golden_missing_from_the_engine_folder_fails_naming_it_and_never_reads_the_packaged_one(project):
    project.runpytest("--snapshot-update").assert_outcomes(passed=1)  # the harness's own golden/ has it
    packaged = (project.path / "golden" / GOLDEN).read_bytes()
    result = project.runpytest("--golden-dir=engine-goldens")
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert f"no golden engine-goldens/{GOLDEN} in engine-goldens/" in output, output[-3000:]
    engine = (project.path / "engine-goldens").resolve()
    update = next(line for line in output.splitlines() if line.rstrip().endswith(" --snapshot-update"))
    assert f"--golden-dir={engine} " in update, update
    assert (project.path / "golden" / GOLDEN).read_bytes() == packaged
    assert not (project.path / "engine-goldens").exists()  # a run without --snapshot-update writes nothing


def test_a_failed_golden_hint_names_the_engine_folder(project, change_the_suite):
    project.runpytest("--snapshot-update", "--golden-dir=engine-goldens").assert_outcomes(passed=1)
    change_the_suite()
    result = project.runpytest("--golden-dir=engine-goldens")
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "review `git diff engine-goldens/`" in output, output[-3000:]
    assert f"does not match engine-goldens/{GOLDEN}" in output, output[-3000:]
    assert "git diff golden/" not in output
    # the reproduce line carries the folder, absolute: the ini that may have named it is not read elsewhere
    assert f"--golden-dir={(project.path / 'engine-goldens').resolve()}" in output


def test_an_orphan_in_the_engine_folder_fails_the_run_naming_it(project):
    project.runpytest("--snapshot-update", "--golden-dir=engine-goldens").assert_outcomes(passed=1)
    orphan = project.path / "engine-goldens/demo/test_demo/test_gone.json"
    orphan.write_text("{}\n")
    result = project.runpytest("--golden-dir=engine-goldens")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*ORPHANED golden engine-goldens/demo/test_demo/test_gone.json*"])


def _one_error_line(result) -> str:
    lines = [line for line in result.stderr.lines if line.strip()]
    assert len(lines) == 1, result.stderr.lines
    return lines[0]


def test_snapshot_update_into_an_installed_harness_is_refused_in_one_line(project, monkeypatch):
    monkeypatch.setenv("SIMULATE_WHEEL", "1")
    result = project.runpytest_subprocess("--snapshot-update")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    line = _one_error_line(result)
    assert "--snapshot-update would write the goldens into the installed harness" in line, line
    assert "--golden-dir=PATH" in line and "harness_golden_dir" in line, line
    assert _goldens(project.path / "golden") == []
    # a folder of the engine's own is written
    project.runpytest_subprocess("--snapshot-update", "--golden-dir=engine-goldens").assert_outcomes(passed=1)
    assert _goldens(project.path / "engine-goldens") == [GOLDEN]


def test_a_failed_packaged_golden_says_how_to_keep_goldens_of_your_own(project, change_the_suite, monkeypatch):
    project.runpytest("--snapshot-update").assert_outcomes(passed=1)
    change_the_suite()
    monkeypatch.setenv("SIMULATE_WHEEL", "here")
    result = project.runpytest_subprocess()
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "a golden of the installed harness, which --snapshot-update does not rewrite" in output, output[-3000:]
    assert "--snapshot-update --golden-dir=PATH" in output and "git diff golden/" not in output


def test_only_the_capture_plan_the_contract_fixes_is_compared():
    plan = {"discovery": {}, "graphs": {"8": {"segments": 3, "breaks": 2, "pool_bytes": 4096}}, "engine": [1]}
    assert fixed_capture_plan(plan) == {"8": {"segments": 3, "breaks": 2}}
    with pytest.raises(AssertionError, match="without breaks"):
        fixed_capture_plan({"graphs": {"8": {"segments": 3}}})


_EXTRA_KEYS_RUNNER = """from harness import impls

_reference = impls.load("runner", "reference").obj


def make_runner(model, *, buckets, graphs, strict_discovery=False):
    runner = _reference(model, buckets=buckets, graphs=graphs, strict_discovery=strict_discovery)
    plan = runner.capture_plan

    def capture_plan():  # docs/runner.md: "at least" the graphs entry; an engine's own bookkeeping besides
        more = plan()
        for entry in more["graphs"].values():
            entry["pool_bytes"] = 4096
        more["engine"] = {"captures": len(more["graphs"])}
        return more

    runner.capture_plan = capture_plan
    return runner
"""


@pytest.mark.long_running
def test_a_runner_whose_capture_plan_has_more_keys_passes_the_capture_plan_goldens(tmp_path):
    (tmp_path / "extra_keys_runner.py").write_text(_EXTRA_KEYS_RUNNER)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/runner/test_goldens.py", "-k", "test_capture_plan", "-q",
         "-p", "no:cacheprovider", "--device", "cpu", "--impl", "runner=extra_keys_runner:make_runner",
         f"--harness-report={tmp_path / 'report.json'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": path})
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["outcomes"]["runner"] == {"passed": 4}, report["outcomes"]
