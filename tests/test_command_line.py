"""Usage errors from pytest options and the CLI are one clear line, never a traceback."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=environment)


# Runs several pytest sessions in one child process (pytest.main each), so that the bad-input cases
# below share one interpreter start and one torch import. The first case runs first in a fresh
# interpreter, so a bad HYPOTHESIS_PROFILE is also seen where it used to break: at conftest import.
_DRIVER = """
import contextlib, io, json, os, sys
import pytest

results = {}
for case in json.loads(sys.argv[1]):
    saved = dict(os.environ)
    os.environ.update(case["env"])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = int(pytest.main(case["args"]))
    os.environ.clear()
    os.environ.update(saved)
    results[case["id"]] = {"rc": code, "out": out.getvalue(), "err": err.getvalue()}
print("RESULTS" + json.dumps(results))
"""

_USER_MODULES = {
    "issue12_cli_syntax.py": "def broken(:\n    pass\n",
    "issue12_cli_raises.py": "raise ImportError('libengine.so: cannot open shared object file')\n",
    "issue12_cli_shapes.py": "class NotACapturer:\n    pass\n\n\ndef runner_without_buckets(model, *, graphs):\n    "
                             "return None\n",
}
_QUICK = ["suites/graphs/test_breaks.py", "-q", "-p", "no:cacheprovider"]
# id -> (pytest arguments, environment, expected exit status, pattern of the one error line)
_USAGE_CASES = {
    "unknown-profile-variable": ([], {"HYPOTHESIS_PROFILE": "nonsense"}, 4,
                                 r"unknown hypothesis profile 'nonsense' \(from HYPOTHESIS_PROFILE\)"),
    "unknown-profile-option": (["--hypothesis-profile", "nonsense"], {}, 4,
                               r"unknown hypothesis profile 'nonsense' \(from --hypothesis-profile\); "
                               "the harness registers: dev, ci"),
    "malformed-impl": (["--impl", "gather"], {}, 4, "bad --impl 'gather'"),
    "missing-module": (["--impl", "graphs=missing_pkg.mod:fn"], {}, 4, "cannot be imported"),
    "impl-twice": (["--impl", "gather=reference", "--impl", "gather=eager"], {}, 4,
                   r"--impl gather= is given twice \('reference' and 'eager'\)"),
    "unknown-mutant": (["--impl", "graphs=mutant:nope"], {}, 4, "no registered implementation"),
    "syntax-error": (["--impl", "graphs=issue12_cli_syntax:X"], {}, 4,
                     r"SyntaxError: invalid syntax \(at issue12_cli_syntax.py:1\)"),
    "raises-on-import": (["--impl", "graphs=issue12_cli_raises:X"], {}, 4,
                         r"ImportError: libengine.so: .* \(at issue12_cli_raises.py:1\)"),
    "not-a-capturer": (["--impl", "graphs=issue12_cli_shapes:NotACapturer"], {}, 4,
                       r"NotACapturer\(\) cannot be called as factory\(backend\)"),
    "runner-without-buckets": (["--impl", "runner=issue12_cli_shapes:runner_without_buckets"], {}, 4,
                               r"cannot be called as factory\(model, \*, buckets, graphs, strict_discovery=False\)"),
    "blob-other-version": (["--reproduce-failure", "0.0.1:AAAA"], {}, 4,
                           r"recorded with hypothesis 0.0.1, this is .*drop --reproduce-failure"),
    "report-under-a-file": (["--harness-report=pyproject.toml/report.json"], {}, 4,
                            r"--harness-report pyproject.toml/report.json: .*pyproject.toml is a file"),
    "report-is-a-folder": (["--harness-report=suites"], {}, 4, r"--harness-report suites: .* is a folder"),
    "blob-malformed": (["--reproduce-failure", "not a blob"], {}, 4, r"expected VERSION:BLOB"),
    "report-as-two-words": (["--harness-report", "report.json"], {}, 4,
                            r"^ERROR: --harness-report report\.json: join the path to its option, "
                            r"--harness-report=report\.json: "),
    "golden-dir-as-two-words-in-addopts": ([], {"PYTEST_ADDOPTS": "--golden-dir goldens"}, 4,
                                           r"^ERROR: --golden-dir goldens in PYTEST_ADDOPTS: join the path to its "
                                           r"option, --golden-dir=goldens: "),
    "blob-several-tests": (["--reproduce-failure", "1.0:AAAA"], {}, 4, r"one test's example, but \d+ tests"),
}
if importlib.util.find_spec("sglang") is None:  # an engine adapter selected where the engine is missing
    _USAGE_CASES["adapter-without-engine"] = (["--impl", "gather=sglang"], {}, 4,
                                              r"--impl gather=sglang needs SGLang.*pip install sglang==0\.5\.23")
if not torch.cuda.is_available():  # asking for a GPU is only an error where there is none
    _USAGE_CASES["device-cuda"] = (["--device", "cuda"], {}, 4, "--device cuda was requested but .* sees no CUDA "
                                                                "device")
    _USAGE_CASES["graph-backend-cuda"] = (["--graph-backend", "cuda"], {}, 4, "--graph-backend cuda was requested but "
                                                                              "torch sees no CUDA device")


@pytest.fixture(scope="module")
def usage_results(tmp_path_factory) -> dict[str, dict]:
    import hypothesis

    folder = tmp_path_factory.mktemp("user_modules")
    for name, text in _USER_MODULES.items():
        (folder / name).write_text(text)
    cases = []
    for case_id, (args, env, _, _) in _USAGE_CASES.items():
        if case_id == "blob-several-tests":
            args = ["--reproduce-failure", f"{hypothesis.__version__}:AAAA"]
        cases.append({"id": case_id, "args": [*_QUICK, *args], "env": env})
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    completed = _run("-c", _DRIVER, json.dumps(cases), env={"PYTHONPATH": path})
    marker = completed.stdout.rfind("RESULTS")
    assert marker >= 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return json.loads(completed.stdout[marker + len("RESULTS"):])


@pytest.mark.parametrize("case_id", list(_USAGE_CASES))
def test_bad_input_is_one_line_with_the_usage_error_status(usage_results, case_id):
    """Exit 4 (pytest's usage error) and one ERROR line naming the problem, no traceback."""
    _, _, status, pattern = _USAGE_CASES[case_id]
    result = usage_results[case_id]
    output = result["out"] + result["err"]
    assert result["rc"] == status, output
    errors = [line for line in result["err"].splitlines() if line.strip()]
    assert len(errors) == 1 and re.search(pattern, errors[0]), output
    assert "Traceback" not in output and "INTERNALERROR" not in output


def test_a_path_option_as_two_words_is_refused_before_the_run_and_joined_it_runs(tmp_path: Path,
                                                                                 installed_suites: None):
    """Written as two words, a path option's existing value (a report an earlier run left, a goldens folder outside
    the repository) counts as a test path where pytest looks for its rootdir and ini, under --pyargs too, and moves
    them; each of the harness's path options is refused so, in one line naming the joined form, exit status 4, no test
    run. Joined, the same run keeps this checkout's rootdir and passes."""
    from harness.plugin import options

    assert set(options.path_options()) == {"--golden-dir", "--harness-report"}  # a new one: give it a value below
    values = {"--harness-report": tmp_path / "earlier" / "report.json", "--golden-dir": tmp_path / "goldens"}
    values["--harness-report"].parent.mkdir()
    values["--harness-report"].write_text("{}")
    values["--golden-dir"].mkdir()
    run = ["-m", "pytest", "--pyargs", "harness.suites.graphs.test_breaks", "-k", "test_counts_and_names",
           "-p", "no:cacheprovider", "--device", "cpu"]
    for option, value in values.items():
        refused = _run(*run, option, str(value))
        output = refused.stdout + refused.stderr
        assert refused.returncode == 4, output[-3000:]
        assert [line for line in output.splitlines() if line.strip()] == [
            f"ERROR: {option} {value}: join the path to its option, {option}={value}: pytest reads a separate value "
            "as a test path while it looks for its rootdir and ini file, before the harness's options are known, so "
            "an existing path there moves the rootdir"], output[-3000:]
        joined = _run(*run, f"{option}={value}")
        output = joined.stdout + joined.stderr
        assert joined.returncode == 0, output[-3000:]
        assert re.search(rf"^rootdir: {re.escape(str(ROOT))}\nconfigfile: pyproject.toml$", output, re.MULTILINE), (
            output[-3000:])
    assert json.loads(values["--harness-report"].read_text())  # the joined run wrote its report there


@pytest.mark.parametrize(
    ("arguments", "pattern"),
    [
        (["bench", "nothing"], "no benchmark called 'nothing'"),
        (["selfcheck", "--component", "nothing"], "unknown component(s) nothing"),
    ],
)
def test_cli_errors_are_one_line(capsys, arguments, pattern):
    from harness import cli

    assert cli.main(arguments) == 2
    err = capsys.readouterr().err.strip()
    assert pattern in err and "\n" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="asking for a GPU is only an error where there is none")
@pytest.mark.parametrize(("options", "pattern"), [(["--device", "cuda"], "--device cuda was requested"),
                                                  (["--graph-backend", "cuda"], "--graph-backend cuda was requested")])
def test_selfcheck_without_gpu_stops_before_any_child_process(monkeypatch, capsys, options, pattern):
    from harness import cli, selfcheck

    def started(**_):
        raise AssertionError("selfcheck started its pytest processes")

    monkeypatch.setattr(selfcheck, "run_selfcheck", started)
    assert cli.main(["selfcheck", *options]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and pattern in err and "\n" not in err


def test_bench_help_reaches_the_benchmark(capsys):
    from harness import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(["bench", "gather", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "--counts" in out and "--hidden-size" in out, out  # the gather benchmark's own options
    with pytest.raises(SystemExit) as exited:
        cli.main(["bench", "--help"])
    assert exited.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines where it likes
    assert "gather" in out and "runner" in out and "bench NAME --help" in out and "``" not in out


@pytest.mark.parametrize(("argv0", "prog"), [("/venv/bin/graph-harness", "graph-harness"),
                                             (str(ROOT / "harness" / "__main__.py"), "python -m harness")])
def test_help_names_the_program_as_invoked(monkeypatch, capsys, argv0, prog):
    from harness import cli

    monkeypatch.setattr(sys, "argv", [argv0, "--help"])
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {prog} ") and "``" not in out and f"'{prog} COMMAND --help'" in out


def test_list_shows_every_component_with_reference_oracle_and_mutants(capsys):
    from harness import cli, components, impls

    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for row in components.COMPONENTS:
        assert f"{row.name}: {row.summary}" in out
        for target in (row.reference, row.oracle, row.suite, row.doc):
            assert target in out
        for mutant in impls.mutants(row.name):
            assert re.search(rf"^    {re.escape(mutant.name.removeprefix('mutant:'))} +{re.escape(mutant.bug)}$",
                             out, re.MULTILINE), mutant.name
    assert cli.main(["list", "--component", "nothing"]) == 2


def test_every_declared_marker_is_used():
    """A marker means what it says only if tests carry it: none may be declared and unused."""
    from harness.plugin import MARKERS

    declared = list(MARKERS)
    assert declared, "the plugin declares no marker"
    sources = "".join(path.read_text() for folder in ("suites", "tests") for path in (ROOT / folder).rglob("*.py"))
    unused = [name for name in declared if f"mark.{name}" not in sources]
    assert not unused, f"markers declared by harness.plugin but used by no test: {unused}"


def test_selfcheck_reports_a_surviving_mutant(monkeypatch):
    """A mutant that behaves like the reference must be reported as a survivor, and fail the check."""
    from harness import impls, selfcheck
    from harness.graphs import GraphCapturer

    # The child process selects it by path: a "mutant" that is the reference itself.
    survivor = impls.Implementation("graphs", "harness.graphs:GraphCapturer", GraphCapturer, "mutant", "control")
    outcome = selfcheck.run_one(survivor, graph_backend="emulated", device="cpu", root=ROOT,
                                extra_args=["-k", "frozen"])
    assert outcome.verdict == "survived" and not outcome.ok


def test_version_names_the_distribution_and_its_version(capsys):
    from harness import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)[1]
    assert capsys.readouterr().out.strip() == f"llm-graph-harness {version}"
