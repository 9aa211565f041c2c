"""Compile and launch accounting, the probe's verdicts, and the benchmark's output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from harness import bench
from harness.gather import GatherCase, compile_accounting, compiled_gather, count_launches, eager_gather
from harness.gather.probe import ProbeCase, probe
from harness.graphs import GraphCapturer, get_backend


def test_compile_accounting_counts_graphs_and_breaks():
    torch._dynamo.reset()

    def with_break(x):
        y = x + 1
        torch._dynamo.graph_break()
        return y * 2

    compiled = torch.compile(with_break, backend="eager")
    with compile_accounting() as tally:
        compiled(torch.ones(3))
    assert tally.graphs == 2 and tally.graph_breaks == 1 and tally.fell_back
    with compile_accounting() as again:
        compiled(torch.ones(3))
    assert again.graphs == 0 and not again.fell_back


def test_hitting_the_recompile_limit_is_an_error_not_a_silent_fallback():
    static = torch.compile(eager_gather, dynamic=False, backend="eager")  # a new graph for every count
    buffers = GatherCase(pool=32, count=0, seed=0).build().buffers
    with pytest.raises(Exception) as raised, compile_accounting(recompile_limit=2):
        for count in range(2, 6):
            static(torch.arange(count), *buffers)
    assert type(raised.value).__name__ == "FailOnRecompileLimitHit"


def test_reference_runs_compiled_and_stays_compiled_after_an_emulated_capture():
    inputs = GatherCase(pool=32, count=5, seed=0).build()
    compiled_gather(*inputs.args)
    assert count_launches(lambda: compiled_gather(*inputs.args), device="cpu").compiled_regions == 1
    assert count_launches(lambda: eager_gather(*inputs.args), device="cpu").aten_ops == 4
    GraphCapturer(get_backend("emulated")).capture(lambda: compiled_gather(*inputs.args))
    # The emulated capture records under a TorchDispatchMode, where Dynamo cannot trace; the backend
    # holds the force_eager stance so Dynamo does not remember a skip for this code object.
    after_capture = count_launches(lambda: compiled_gather(*inputs.args), device="cpu")
    assert after_capture.compiled_regions == 1, "after an emulated capture the compiled gather silently runs eagerly"


def crashing_gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf):
    """Dies like an unchecked kernel on an out-of-range index, and is correct otherwise."""
    if bool((indices >= topk_p_buf.shape[0]).any()):
        os.kill(os.getpid(), signal.SIGKILL)  # SIGKILL: no core file left behind
    return eager_gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf)


@pytest.mark.long_running
def test_probe_reports_each_outcome_and_survives_a_crash():
    pool = 5
    cases = [
        ProbeCase("in-range", GatherCase(pool=pool, count=2, seed=0, index_values=(-1, 4)), valid=True),
        ProbeCase("past-end", GatherCase(pool=pool, count=1, seed=0, index_values=(5,)), valid=False),
        ProbeCase("after-crash", GatherCase(pool=pool, count=1, seed=0, index_values=(-6,)), valid=False),
    ]
    results = probe(f"{__name__}:crashing_gather", cases, device="cpu")
    outcomes = {name: result.outcome for name, result in results.items()}
    assert outcomes == {"in-range": "correct", "past-end": "crashed", "after-crash": "raised"}, results
    assert "killed by signal 9" in results["past-end"].detail


def thread_count_gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf):
    """Raises with the intra-op thread count of the process it runs in."""
    raise RuntimeError(f"intra-op threads {torch.get_num_threads()}")


def test_probe_child_runs_on_the_parents_thread_count():
    """Inductor's CPU kernels and their cache keys depend on the thread count: on another count than the test
    process's (a fresh interpreter takes one per core), the child would compile every graph anew instead of
    loading the test process's. One thread, as the harness sets on the CPU."""
    before, threads = torch.get_num_threads(), 1
    torch.set_num_threads(threads)
    try:
        case = ProbeCase("any", GatherCase(pool=5, count=1, seed=0), valid=False)
        result = probe(f"{__name__}:thread_count_gather", [case], device="cpu")["any"]
    finally:
        torch.set_num_threads(before)
    assert result.outcome == "raised" and f"intra-op threads {threads}" in result.detail, result


@pytest.mark.long_running
def test_bench_writes_a_row_per_point(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert bench.main(["gather", "--device", "cpu", "--counts", "1,3", "--pool", "16", "--hidden-size", "8",
                       "--json", str(path), "--impl", "gather=mutant:int32-bonus-tokens"]) == 0
    report = json.loads(path.read_text())
    points = {(r["implementation"], r["hidden"], r["count"]) for r in report["rows"]}
    assert len(points) == 3 * 2 * 2 and report["compile"]["eager"]["graphs"] == 0
    assert report["compile"]["reference"]["graphs"] >= 1
    assert report["implementation"] == "mutant:int32-bonus-tokens"
    assert "mutant:int32-bonus-tokens" in capsys.readouterr().out


def test_bench_rejects_another_component(capsys):
    assert bench.main(["gather", "--device", "cpu", "--impl", "graphs=reference"]) == 2
    assert "this benchmark measures gather, not graphs" in capsys.readouterr().err


@pytest.mark.long_running
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: the profiler's CUDA activity cannot run"))])
def test_bench_gather_prints_no_profiler_log_line(device):
    """The profiler's C++ side (kineto) printed two ``USDT: ... profiler_start/stop`` lines per profile to
    stderr: 48 in a ``bench gather`` on the CPU. A child process, since kineto reads its log level once per
    process, when the process's first profile starts (another test here may have started one)."""
    environment = {key: value for key, value in os.environ.items() if key != "KINETO_LOG_LEVEL"}
    completed = subprocess.run([sys.executable, "-m", "harness", "bench", "gather", "--device", device, "--counts", "1",
                                "--pool", "8", "--topk", "2", "--hidden-size", "8", "--repeat", "2", "--calls", "2"],
                               capture_output=True, text=True, env=environment, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    # the table of the profiler's counts: it ran
    assert ("kernels/call" if device == "cuda" else "ATen ops/call") in completed.stdout
    output = completed.stdout.splitlines() + completed.stderr.splitlines()
    assert [line for line in output if line.startswith("USDT")] == []


def test_the_profiler_is_quieted_only_while_it_runs_and_a_users_level_is_kept(monkeypatch):
    seen = []
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    count_launches(lambda: seen.append(os.environ.get("KINETO_LOG_LEVEL")), device="cpu", calls=1)
    assert seen[0] is not None and "KINETO_LOG_LEVEL" not in os.environ
    monkeypatch.setenv("KINETO_LOG_LEVEL", "0")  # someone reading kineto's own logs
    count_launches(lambda: seen.append(os.environ.get("KINETO_LOG_LEVEL")), device="cpu", calls=1)
    assert seen[1] == "0" and os.environ["KINETO_LOG_LEVEL"] == "0"
