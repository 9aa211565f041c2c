"""An engine's own goldens (issue 33, item 1): a golden compares only what the contract fixes (the capture
plan's "at least")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.runner.candidate import fixed_capture_plan

ROOT = Path(__file__).resolve().parent.parent


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
         "--harness-report", str(tmp_path / "report.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": path})
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["outcomes"]["runner"] == {"passed": 4}, report["outcomes"]
