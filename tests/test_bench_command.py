"""The bench command end to end on the emulated backend: counts only, exit status from the baseline.

Small settings (one model, two batches) keep it to seconds; nothing here is timed. The oracle for
"regressed" is the construction of the variants: an eager-running runner launches exactly the eager
model's ops, so its run count must equal the baseline's eager count.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--device", "cpu", "--models", "dense", "--compositions", "1;2,2"]


def bench(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "bench", *arguments], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def runner_baseline(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "runner.json"
    completed = bench("runner", *SMALL, "--json", str(path))
    assert completed.returncode == 0, completed.stderr
    assert "EMULATION" in completed.stdout
    return path


def test_emulated_report_holds_counts_and_no_times(runner_baseline):
    report = json.loads(runner_baseline.read_text())
    assert report["environment"]["device_class"] == "cpu/emulated"
    assert {figure["kind"] for figure in report["figures"].values()} == {"count"}
    assert report["figures"]["dense/tiny/2+2/eager_fallbacks"]["value"] == 0
    # Four buckets captured, each a graph of attention breaks between segments.
    assert report["figures"]["dense/tiny/captures"]["value"] == 4


def test_rerun_passes_and_eager_fallback_fails(runner_baseline):
    rerun = bench("runner", *SMALL, "--baseline", str(runner_baseline))
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "no regression" in rerun.stdout
    fallback = bench("runner", *SMALL, "--baseline", str(runner_baseline),
                     "--impl", "runner=harness.bench.variants:EagerFallbackRunner")
    assert fallback.returncode == 1, fallback.stdout + fallback.stderr
    baseline = json.loads(runner_baseline.read_text())["figures"]
    eager_ops = baseline["dense/tiny/1/launches_eager"]["value"]
    assert f"changed    dense/tiny/1/launches_run: {baseline['dense/tiny/1/launches_run']['value']:.4g} -> " \
           f"{eager_ops:.4g}" in fallback.stdout


@pytest.mark.parametrize(("arguments", "message"), [
    (["runner", "--impl", "gather=reference"], "this benchmark measures runner, not gather"),
    (["runner", "--compositions", "40"], "more than the largest bucket 32"),
    (["runner", "--graph-backend", "cuda", "--device", "cpu"], "--graph-backend cuda needs --device cuda"),
    (["gather", "--counts", "a,b"], "expected comma-separated integers"),
])
def test_bad_options_are_one_line(arguments, message):
    completed = bench(*arguments)
    assert completed.returncode == 2
    assert message in completed.stderr and "Traceback" not in completed.stderr


def test_every_benchmark_lists_shared_and_own_options():
    for name, own in (("runner", "--compositions"), ("gather", "--counts"), ("tolerance", "--dtypes")):
        completed = bench(name, "--help")
        assert completed.returncode == 0
        for option in ("--device", "--graph-backend", "--impl", "--json", "--repeat", "--baseline", own):
            assert option in completed.stdout, (name, option)


def test_plot_without_the_extra_is_a_usage_error_before_measuring():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        completed = bench("runner", "--plot", "speedup.png")
        assert completed.returncode == 2
        assert "pip install -e .[plot]" in completed.stderr and "Traceback" not in completed.stderr
    else:
        pytest.skip("matplotlib is installed here: the missing-extra message cannot be shown")
