"""Usage errors from pytest options and the CLI are one clear line, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        (["--impl", "gather"], "bad --impl 'gather'"),
        (["--impl", "graphs=missing_pkg.mod:fn"], "cannot be imported"),
        (["--impl", "graphs=mutant:nope"], "no registered implementation"),
    ],
)
def test_bad_pytest_options_are_usage_errors(options, pattern):
    completed = _run("-m", "pytest", "suites/graphs", "-q", "-p", "no:cacheprovider", *options)
    assert completed.returncode == 4, completed.stdout + completed.stderr
    assert pattern in completed.stderr and "Traceback" not in completed.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="asking for a GPU is only an error where there is none")
@pytest.mark.parametrize("options", [["--device", "cuda"], ["--graph-backend", "cuda"]])
def test_gpu_requested_without_gpu_is_a_usage_error(options):
    completed = _run("-m", "pytest", "suites/graphs", "-q", "-p", "no:cacheprovider", *options)
    assert completed.returncode == 4
    assert "sees no CUDA device" in completed.stderr and "Traceback" not in completed.stderr


@pytest.mark.parametrize(
    ("arguments", "pattern"),
    [
        (["bench", "nothing"], "no benchmark called 'nothing'"),
        (["selfcheck", "--component", "nothing"], "unknown component(s) nothing"),
    ],
)
def test_cli_errors_are_one_line(arguments, pattern):
    completed = _run("-m", "harness", *arguments)
    assert completed.returncode == 2
    assert pattern in completed.stderr and "Traceback" not in completed.stderr


def test_selfcheck_reports_a_surviving_mutant(monkeypatch):
    """A mutant that behaves like the reference must be reported as a survivor, and fail the check."""
    from harness import impls, selfcheck
    from harness.graphs import GraphCapturer

    # The child process selects it by path: a "mutant" that is the reference itself.
    survivor = impls.Implementation("graphs", "harness.graphs:GraphCapturer", GraphCapturer, "mutant", "control")
    outcome = selfcheck.run_one(survivor, graph_backend="emulated", device="cpu", root=ROOT,
                                extra_args=["-k", "frozen"])
    assert outcome.verdict == "survived" and not outcome.ok
