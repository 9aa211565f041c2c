"""Records keyed by upstream versions: the installed release's own record is held exactly, a release without one is
compared with the nearest record and reported as upstream drift (never failed), with the command that records it;
the drift summary sets the installed versions beside the constraints file's pins."""

from __future__ import annotations

import json
import re
from pathlib import Path

# pytester's in-process runs restore sys.modules after each test: imported here, hypothesis and torch (which the
# harness imports when a run activates it) keep one module each for the whole session.
import hypothesis  # noqa: F401
import pytest
import torch  # noqa: F401

from harness import upstream
from harness.plugin.report import format_markdown
from harness.upstream import nearest_version, parse_version, read_pins

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("text, version", [("2.13.0+cpu", (2, 13, 0)), ("5.25.0rc1", (5, 25, 0)), ("6", (6,)),
                                           ("dev", None)])
def test_a_version_string_gives_its_release_numbers(text, version):
    assert parse_version(text) == version


def test_the_nearest_record_is_the_newest_below_else_the_oldest_above():
    recorded = [(5, 24, 0), (5, 25, 0), (5, 30, 1)]
    assert nearest_version((5, 26, 0), recorded) == (5, 25, 0)
    assert nearest_version((5, 99, 0), recorded) == (5, 30, 1)
    assert nearest_version((5, 20, 0), recorded) == (5, 24, 0)
    assert nearest_version((5, 20, 0), []) is None


def test_pins_are_read_from_name_equals_version_lines(tmp_path):
    (tmp_path / "c.txt").write_text("# header\ntransformers==5.24.0 ; python_version >= '3.11'\n"
                                    "Pytest_Xdist == 3.8.0  # comment\nnumpy>=2\n\n")
    assert read_pins(tmp_path / "c.txt") == {"transformers": "5.24.0", "pytest-xdist": "3.8.0"}


def test_the_repository_constraints_pin_every_upstream_package_but_torch():
    # torch is pinned by the install command itself (the CPU wheel here, GPU_TORCH_VERSION on the GPU runners)
    pins = read_pins(ROOT / "constraints.txt")
    assert set(upstream.UPSTREAM_PACKAGES) - {"torch"} <= set(pins), sorted(set(upstream.UPSTREAM_PACKAGES) - set(pins))
    assert "torch" not in pins


# A result that depends on "transformers"' code: which stacks capture.
_SUITE = '''
from harness.golden import assert_upstream_golden

CAPTURES = {"falcon": False, "llama": True}

def test_matrix(snapshot):
    assert_upstream_golden(snapshot, {"captures": CAPTURES}, package="transformers", prefix="cpu-")
'''


@pytest.fixture
def project(golden_project, monkeypatch):
    pytester = golden_project(_SUITE)
    installed = {"transformers": (5, 24, 0)}
    monkeypatch.setattr(upstream, "installed_version", lambda package: installed.get(package))
    pytester.installed = installed
    return pytester


def _goldens(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "golden").rglob("*.json"))}


def test_a_newer_release_is_upstream_drift_reported_with_its_record_command_not_a_failure(project, rewrite_module):
    project.runpytest("--snapshot-update", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert list(_goldens(project.path)) == ["test_matrix[cpu-transformers-5.24.0].json"]
    suite = project.path / "suites/demo/test_demo.py"
    rewrite_module(suite, _SUITE.replace('"falcon": False', '"falcon": True'))  # the new release captures falcon

    # the recorded release's own golden is held exactly: there the difference is the harness's, and fails
    project.runpytest("-p", "no:cacheprovider").assert_outcomes(failed=1)

    project.installed["transformers"] = (5, 99, 0)  # a simulated release nobody recorded
    before = _goldens(project.path)
    result = project.runpytest("-p", "no:cacheprovider", "--harness-report=report.json")
    result.assert_outcomes(passed=1)
    assert _goldens(project.path) == before
    result.stdout.fnmatch_lines([
        "*upstream drift: transformers 5.99.0 has no record of its own; against 5.24.0's, 1 difference(s)*",
        "*captures.falcon: - false  + true*",
        "*record it: *test_demo.py::test_matrix *--snapshot-update*"])
    (event,) = json.loads((project.path / "report.json").read_text())["goldens"]["drift"]
    assert event["where"] == "cpu-transformers-5.99.0" and event["differences"] == ["captures.falcon: - false  + true"]

    # the summary the drift job publishes: installed beside pinned, and the drift
    pins = project.path / "constraints.txt"
    pins.write_text("transformers==5.24.0\n")
    report = json.loads((project.path / "report.json").read_text())
    report["setup"]["upstream"]["transformers"] = "5.99.0"  # what the metadata of the simulated release says
    summary = format_markdown(report, pins=read_pins(pins))
    assert "| transformers | 5.24.0 | 5.99.0 | **newer** |" in summary
    assert "captures.falcon: - false  + true" in summary

    # one reviewed --snapshot-update records the release's own; from then on it is held exactly
    project.runpytest("--snapshot-update", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert sorted(_goldens(project.path)) == ["test_matrix[cpu-transformers-5.24.0].json",
                                              "test_matrix[cpu-transformers-5.99.0].json"]
    assert _goldens(project.path)["test_matrix[cpu-transformers-5.24.0].json"] == before[
        "test_matrix[cpu-transformers-5.24.0].json"]
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "has no record of its own" not in result.stdout.str()


def test_a_release_between_records_is_compared_with_the_one_below(project, rewrite_module):
    project.runpytest("--snapshot-update", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    project.installed["transformers"] = (5, 30, 0)
    rewrite_module(project.path / "suites/demo/test_demo.py", _SUITE.replace('"llama": True', '"llama": False'))
    project.runpytest("--snapshot-update", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    project.installed["transformers"] = (5, 27, 1)  # nearest below: 5.24.0, whose llama captured
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*transformers 5.27.1 has no record of its own; against 5.24.0's, 1 difference*",
                                 "*captures.llama: - true  + false*"])


def test_with_nothing_recorded_the_missing_golden_fails_as_any_missing_golden(project):
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no golden golden/demo/test_demo/test_matrix?cpu-transformers-5.24.0?.json*"])
    assert "has no record of its own" not in result.stdout.str()


def test_a_checkout_run_names_the_upstream_versions_that_moved_from_its_pins(project):
    import importlib.metadata

    project.runpytest("--snapshot-update", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    (project.path / "constraints.txt").write_text("transformers==0.0.1\npytest==" + importlib.metadata.version("pytest")
                                                  + "\n")
    result = project.runpytest("-p", "no:cacheprovider", "--harness-report=report.json")
    result.assert_outcomes(passed=1)
    installed = importlib.metadata.version("transformers")
    result.stdout.fnmatch_lines([f"*upstream drift: transformers {installed} (pinned 0.0.1) in constraints.txt*"])
    assert "pytest " + importlib.metadata.version("pytest") + " (pinned" not in result.stdout.str()
    report = json.loads((project.path / "report.json").read_text())
    assert f"| transformers | 0.0.1 | {installed} | **newer** |" in format_markdown(report)


def test_every_set_up_from_the_checkout_installs_the_pins():
    """The README's commands, .ci/run and the workflows install the harness from its checkout with the constraints;
    only the version matrix (the ends of pyproject's ranges) and the drift job (the newest releases) go without,
    and the drift job publishes its summary beside the pins."""
    places = {ROOT / ".ci/run": (ROOT / ".ci/run").read_text(), **{
        path: path.read_text() for path in sorted((ROOT / ".github/workflows").glob("*.yml"))}}
    places[ROOT / "README.md"] = (ROOT / "README.md").read_text()
    installs = [(path.name, line.strip()) for path, text in places.items() for line in text.splitlines()
                if re.search(r"pip\"? install .*-e \.", line) and not line.strip().startswith("#")]
    unpinned = [(name, line) for name, line in installs
                if "-c constraints.txt" not in line and "$SYRUPY" not in line and "--upgrade" not in line
                and "dist/llm_graph_harness" not in line]  # an engine's own install of the harness's wheel
    assert installs and not unpinned, f"installs from the checkout without -c constraints.txt: {unpinned}"
    workflow = (ROOT / ".github/workflows/ci.yml").read_text()
    drift = workflow[workflow.index("\n  drift:"):]
    assert "--upgrade -e ." in drift and "--constraints constraints.txt" in drift, drift
