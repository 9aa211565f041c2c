"""The harness's pytest plugin (a ``pytest11`` entry point, so loaded by every pytest where the harness is
installed) leaves an engine's own unrelated test runs as they were, and still does everything in a run
that asks for the harness (a harness option) or collects its suites or fixtures.

Each run is a child pytest in a folder of its own; the plugin is named with ``-p harness.plugin``
(the entry point's name, so it is the same plugin) and, for the run it is compared with, blocked with
``-p no:harness.plugin``: the same run as it is where the harness is not installed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent

# An engine's own test: it records what the harness could have changed in its process.
_ENGINE_TEST = '''
import json, os, signal
import torch
import torch._inductor.config
from hypothesis import settings

def test_records(request, snapshot):
    profile = settings.default
    handler = signal.getsignal(signal.SIGALRM)
    snapshot_fixture = request._pyfuncitem._fixtureinfo.name2fixturedefs["snapshot"][-1]
    observed = {
        "threads": torch.get_num_threads(),
        "profile": settings.get_current_profile_name(),
        "settings": [profile.max_examples, str(profile.deadline), profile.derandomize, str(profile.phases),
                     [str(check) for check in profile.suppress_health_check], str(profile.database)],
        "environment": sorted(os.environ),
        "alarm_handler": getattr(handler, "__module__", str(handler)),
        "snapshot_fixture": snapshot_fixture.func.__module__,
        "disable_unused_snapshots": request.config.option.disable_unused_snapshots,
        "warn_unused_snapshots": request.config.option.warn_unused_snapshots,
        "compile_threads": torch._inductor.config.compile_threads,
    }
    with open("observed.json", "w") as handle:
        json.dump(observed, handle)
'''


# Read at import: pytester, which the fixture below needs first, removes PYTEST_ADDOPTS from the environment.
_MACHINE_BLOCKED_PLUGINS = re.findall(r"-p\s*no:\S+", os.environ.get("PYTEST_ADDOPTS", ""))


@pytest.fixture
def engine(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A folder with an engine's own test and nothing of the harness; no variable of this run's own leaks in."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "HYPOTHESIS_PROFILE",
                 "HARNESS_EXPERTS_IMPLEMENTATION", "HARNESS_FAILURE_LOG", "TORCHINDUCTOR_COMPILE_THREADS"):
        monkeypatch.delenv(name, raising=False)
    # Of this run's PYTEST_ADDOPTS only the plugins the machine keeps out stay (a GPU image's pytest-benchmark,
    # which .ci/gpu/run blocks: loaded, it leaves its own .benchmarks folder in the engine's folder).
    if _MACHINE_BLOCKED_PLUGINS:
        monkeypatch.setenv("PYTEST_ADDOPTS", " ".join(_MACHINE_BLOCKED_PLUGINS))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the same device (cpu) on a GPU runner too: --device auto
    pytester.makepyfile(test_engine=_ENGINE_TEST)
    return pytester


def _run(pytester: pytest.Pytester, *args: str) -> tuple[str, dict, list[str]]:
    """The run's output (timings and the plugin list dropped), what the test observed, and the files left."""
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--timeout", "60", *args)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, output[-3000:]
    observed = json.loads((pytester.path / "observed.json").read_text())
    (pytester.path / "observed.json").unlink()
    files = sorted(path.name for path in pytester.path.iterdir()  # but pytester's basetemp and captured output
                   if path.name not in ("__pycache__", "stdout", "stderr") and not path.name.startswith("runpytest-"))
    comparable = "\n".join(line for line in output.splitlines() if not line.startswith("plugins:"))
    return re.sub(r"=+", "=", re.sub(r" in [0-9.]+s", "", comparable)), observed, files


@pytest.mark.parametrize("ci", ["", "true"], ids=["local", "under-CI"])
def test_an_unrelated_run_is_the_same_as_without_the_harness(engine: pytest.Pytester, monkeypatch, ci: str):
    # Under CI hypothesis loads its own "ci" profile, which the harness's profile of that name used to replace.
    monkeypatch.setenv("CI", ci) if ci else monkeypatch.delenv("CI", raising=False)
    without_output, without, without_files = _run(engine, "-p", "no:harness.plugin")
    with_output, observed, files = _run(engine, "-p", "harness.plugin")
    assert observed == without
    assert with_output == without_output  # no header line, no run report
    assert not re.search(r"^harness: |harness run report", with_output, re.MULTILINE)
    assert files == without_files == ["test_engine.py"]  # no report file, no example database
    assert observed["profile"] == ("ci" if ci else "default")
    assert observed["alarm_handler"] == "pytest_timeout"  # pytest-timeout's own timer, not the harness's
    assert observed["snapshot_fixture"].startswith("syrupy")


def test_a_harness_option_activates_everything(engine: pytest.Pytester, monkeypatch):
    """The counterpart of the test above: the same run given one harness option is a harness run."""
    monkeypatch.delenv("CI", raising=False)
    output, observed, files = _run(engine, "-p", "harness.plugin", "--device", "cpu",
                                   "--harness-report=report.json")
    assert re.search(r"^harness: device=cpu, graph backend=emulated, .*hypothesis profile=dev", output, re.MULTILINE)
    assert "harness run report" in output
    assert observed["threads"] == 1 and observed["profile"] == "dev" and observed["settings"][0] == 5
    assert observed["alarm_handler"] == "harness.timeouts"
    assert "HARNESS_EXPERTS_IMPLEMENTATION" in observed["environment"]
    assert observed["snapshot_fixture"] == "harness.plugin.session"
    assert observed["disable_unused_snapshots"] is True
    assert observed["compile_threads"] == 1  # no pool of compile subprocesses in each of a run's processes
    assert files == ["report.json", "test_engine.py"]


def test_a_test_using_a_harness_fixture_activates_it_during_collection(engine: pytest.Pytester, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    engine.makepyfile(test_with_fixture="def test_backend(graph_backend):\n    assert graph_backend.name\n")
    output, observed, _ = _run(engine, "-p", "harness.plugin")
    # announced after collection, where it became known; the engine's own test in the run sees it active
    assert re.search(r"^collected 2 items\nharness: device=cpu, graph backend=emulated", output, re.MULTILINE), output
    assert "harness run report" in output
    assert observed["threads"] == 1 and observed["profile"] == "dev"


def test_help_lists_the_options_without_activating(engine: pytest.Pytester):
    result = engine.runpytest_subprocess("-p", "harness.plugin", "--help")
    help_text = result.stdout.str()
    for option in ("--device=", "--graph-backend=", "--impl=COMPONENT=SPEC", "--tp=N", "--reproduce-failure=",
                   "--harness-report=PATH", "--startup-timeout=SECONDS", "--experts-implementation="):
        assert option in help_text, option
    assert "harness: device=" not in help_text


@pytest.mark.long_running
def test_the_suites_activate_it_when_collected(pytester: pytest.Pytester, monkeypatch):
    """``pytest .`` in a checkout activates the harness on reaching ``suites/`` (before importing them),
    as ``pytest suites/`` does at start-up; the engine's one-file conftest.py (collect_suite) too."""
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    started = pytester.runpytest_subprocess(str(ROOT / "suites" / "graphs" / "test_breaks.py"), "--collect-only",
                                            "-p", "no:cacheprovider", f"--rootdir={ROOT}")
    assert re.search(r"^harness: device=.*hypothesis profile=dev", started.stdout.str(), re.MULTILINE)
    pytester.makeconftest('from harness.plugin import collect_suite\n\n'
                          'pytest_collect_file = collect_suite("graphs")\n')
    # The suite of this checkout (an editable install): collecting it must not need a --confcutdir
    collected = pytester.runpytest_subprocess("--collect-only", "-p", "no:cacheprovider")
    output = collected.stdout.str()
    assert collected.ret == 0, output[-3000:]
    # announced after collection, with the profile the suites' modules were imported under
    assert re.search(r"^collected \d+ items\nharness: device=.*hypothesis profile=dev", output, re.MULTILINE), (
        output[:3000])
    assert "<Module test_breaks.py>" in output


@pytest.mark.parametrize("autoload", ["on", "off"])
def test_the_deprecated_plugin_name_still_loads_the_plugin_once(engine: pytest.Pytester, monkeypatch, autoload):
    """An engine's ``pytest_plugins = ["harness.pytest_plugin"]`` (the name before 0.2) loads the plugin once,
    with or without autoloading, and ``collect_suite`` is still importable from it, with a DeprecationWarning."""
    if autoload == "off":
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    engine.makeconftest('pytest_plugins = ["harness.pytest_plugin"]\n')
    engine.makepyfile(test_alias='''
import warnings

import pytest


def test_collect_suite_is_reachable_with_a_warning():
    with pytest.warns(DeprecationWarning, match="import collect_suite from harness.plugin"):
        from harness.pytest_plugin import collect_suite
    from harness.plugin import collect_suite as current
    assert collect_suite is current


def test_the_plugin_is_registered_once(pytestconfig):
    import harness.plugin

    assert [p for p in pytestconfig.pluginmanager.get_plugins() if p is harness.plugin] == [harness.plugin]
''')
    result = engine.runpytest_subprocess("-p", "no:cacheprovider", "--device", "cpu", "test_alias.py")
    result.assert_outcomes(passed=2)
    assert "harness: device=cpu" in result.stdout.str()


_CHECKOUT_PYPROJECT = """\
[build-system]
requires = ["setuptools"]

[project]
name = "{name}"
version = "0.1.0"

[tool.pytest.ini_options]
addopts = "-p harness.plugin"
"""


@pytest.mark.parametrize("name", ["llm-graph-harness", "my-engine"], ids=["checkout", "other-project"])
def test_a_checkout_whose_plugin_is_another_checkouts_is_refused_in_one_line(pytester: pytest.Pytester, monkeypatch,
                                                                              name: str):
    """A second checkout whose environment holds the first one's install: its runs would test the first
    checkout's code with its suites and goldens, each test failing on the difference. The run stops at
    activation, in one line naming both folders and the fix; a folder of another project is unaffected."""
    import harness

    for variable in ("CI", "HYPOTHESIS_PROFILE", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"):
        monkeypatch.delenv(variable, raising=False)
    # The checkout is a folder below the run's working directory, which `python -m pytest` puts on sys.path: its
    # harness/ (empty: no __init__.py) is never where `harness` is imported from, here or in the run's process.
    checkout = pytester.mkdir("second-checkout")
    (checkout / "pyproject.toml").write_text(_CHECKOUT_PYPROJECT.format(name=name))
    (checkout / "harness").mkdir()
    (checkout / "test_checkout.py").write_text("def test_runs():\n    pass\n")
    installed = Path(harness.__file__).resolve().parent
    assert not installed.is_relative_to(checkout.resolve())
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--device", "cpu", str(checkout))
    output = result.stdout.str() + result.stderr.str()
    if name != "llm-graph-harness":
        assert result.ret == 0, output[-3000:]
        result.assert_outcomes(passed=1)
        assert "is a checkout of llm-graph-harness" not in output
        return
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output[-3000:]
    lines = [line for line in output.splitlines() if "is a checkout of llm-graph-harness" in line]
    assert len(lines) == 1, output[-3000:]
    assert f"rootdir {checkout.resolve()} " in lines[0] and f" {installed}, outside it" in lines[0], lines[0]
    assert lines[0].endswith(f"pip install -e {checkout.resolve()}"), lines[0]
    assert "passed" not in output and "test_runs" not in output, output[-3000:]



# An engine's own test that gets the same kind of warning as the harness's imports and suites cause (a deprecation
# raised in a torch module): the harness must leave it to the engine's filters.
_ENGINE_WARNING = '''
import warnings


def test_engines_own_torch_deprecation():
    warnings.warn_explicit("an engine's own torch deprecation", DeprecationWarning, "torch/engine.py", 1,
                           module="torch.engine")
'''

# The engine's conftest.py records the filterwarnings marks of each collected test (in marks.json).
_FILTER_MARKS_RECORDED = '''
import json


def pytest_collection_finish(session):
    marks = {item.nodeid: [arg for mark in item.iter_markers("filterwarnings") for arg in mark.args]
             for item in session.items}
    with open("marks.json", "w") as handle:
        json.dump(marks, handle)
'''


def test_the_harness_filters_the_warnings_it_causes_in_an_engines_run_and_only_those(engine: pytest.Pytester,
                                                                                       monkeypatch,
                                                                                       installed_suites: None):
    """An engine's run reads the engine's ini, not the harness's: the warnings the harness's own ini filters (torch's
    deprecations, which its imports and its suites set off: Inductor's torch.jit under torch 2.13) are filtered for
    the harness's suite items and around its imports only; the engine's own test keeps its warning."""
    from harness.plugin import warning_filters

    monkeypatch.delenv("CI", raising=False)
    engine.makepyfile(test_engine_warning=_ENGINE_WARNING)
    engine.makeconftest(_FILTER_MARKS_RECORDED)
    output, _, _ = _run(engine, "-p", "harness.plugin", "--device", "cpu", "-k", "typical or engine",
                        "--pyargs", "harness.suites.gather.test_contract", ".")
    marks = json.loads((engine.path / "marks.json").read_text())
    assert {nodeid: filters for nodeid, filters in marks.items() if "test_engine" in nodeid} == {
        "test_engine.py::test_records": [], "test_engine_warning.py::test_engines_own_torch_deprecation": []}, marks
    (suite_test,) = (nodeid for nodeid in marks if "test_typical" in nodeid)
    assert marks[suite_test] == warning_filters.as_ini_lines(), marks
    assert re.search(r"^\S*test_engine_warning\.py::test_engines_own_torch_deprecation\n +\S+: DeprecationWarning: an "
                     r"engine's own torch deprecation$", output, re.MULTILINE), output[-3000:]
    assert re.search(r"^= 3 passed, \d+ deselected, 1 warning =$", output, re.MULTILINE), output[-3000:]
    # the harness's own ini spells the same filters
    ini = (ROOT / "pyproject.toml").read_text()
    assert re.search(r"^filterwarnings = \[\n((?:    \".*\",\n)*)\]$", ini, re.MULTILINE)[1].split() == [
        f'"{line}",' for line in warning_filters.as_ini_lines()]
