"""The capture matrix's shards are shared between the xdist workers of one run only.

A pytest started from a test of an xdist worker (an engine's CI test that runs a suite, as the docs-example
test does) inherits ``PYTEST_XDIST_WORKER``; judged by that variable, it took itself for a worker and read
shards any earlier run had left beside every run's temporary folder: a matrix of other code, which failed the
golden with another rule's column names, or could have passed a regression."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_serial_run_with_an_inherited_worker_variable_computes_its_own_matrix(tmp_path):
    runs = tmp_path / "runs"  # the parent of this run's basetemp, where workers share shards
    runs.mkdir()
    for shard in range(16):  # what an earlier run could have left there: a matrix that fails the golden
        (runs / f"capture-matrix-{shard}.json").write_text(json.dumps({"llama": {"stale": {"captures": False}}}))
    environment = dict(os.environ, PYTEST_XDIST_WORKER="gw0", PYTEST_XDIST_WORKER_COUNT="2")
    environment.pop("PYTEST_ADDOPTS", None)
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/runner/architectures/test_capture.py::test_capture_matrix_golden",
         "-p", "no:cacheprovider", "-p", "no:xdist", "--basetemp", str(runs / "this-run"), "-q"],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-2000:]
    assert "1 passed" in completed.stdout


def test_only_a_real_xdist_worker_sizes_its_thread_pool(monkeypatch):
    """A pytest that a worker's test starts inherits PYTEST_XDIST_WORKER without being a worker: it keeps its
    threads; a worker (``config.workerinput``) takes its share of the cores."""
    import os
    import types

    import torch

    from harness.plugin import session

    before = torch.get_num_threads()
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(4 * (os.cpu_count() or 1)))
    try:
        session._set_up_xdist_worker(types.SimpleNamespace())
        assert torch.get_num_threads() == before
        torch.set_num_threads((os.cpu_count() or 1) + 1)  # not what a lone worker takes
        session._set_up_xdist_worker(types.SimpleNamespace(workerinput={"workerid": "gw0", "workercount": 1}))
        assert torch.get_num_threads() == max(1, os.cpu_count() or 1)
    finally:
        torch.set_num_threads(before)
