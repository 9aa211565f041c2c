"""The slow runner variants that the runner baseline must fail, and the bench step that runs them.

``HostSlowedRunner`` is 20% slower on its host path and nowhere else: with a fake host clock, in which
the work outside the graphs and the graph replays take known times, its wait is 20% of the first and
none of the second (oracle: the construction). On the emulated backend its outputs are the reference
runner's. ``.ci/gpu/bench-variants`` runs every runner variant of ``harness.bench.variants`` and says
"regression found, as it must be" for each one that exits 1, failing when one does not (a stand-in for
``python -m harness bench`` scripts the exit statuses).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
from pathlib import Path

import pytest
import torch

from harness.bench import command, variants
from harness.bench import runner as runner_bench
from harness.bench.variants import HOST_SLOWDOWN, HostSlowedRunner
from harness.graphs import BreakableGraph, GraphCapturer, get_backend
from harness.models import build_model
from harness.runner import ForwardBatch, LayerStackRunner

ROOT = Path(__file__).resolve().parents[1]


class FakeClock:
    """Seconds that pass only when spent, plus a tick per reading (so a busy-wait on it ends)."""

    tick = 1e-7

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.tick
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize("in_graphs", [0.005, 0.05])
def test_host_slowed_runner_waits_a_fifth_of_its_host_path_and_nothing_for_its_graphs(in_graphs):
    clock, outside = FakeClock(), 0.001

    class SlowGraph(BreakableGraph):
        def replay(self):
            clock.spend(in_graphs)
            return super().replay()

    class Capturer(GraphCapturer):
        graph_class = SlowGraph

    class Timed(HostSlowedRunner):
        def hand_out(self, output):
            clock.spend(outside)  # the host path's own work, outside the graphs
            return super().hand_out(output)

    Timed.clock = staticmethod(clock)
    model = build_model("dense", seed=0)
    runner = Timed(model, buckets=(4,), graphs=Capturer(get_backend("emulated")))
    batch = ForwardBatch.from_lengths([3], vocab_size=model.config.vocab_size, seed=1)
    started = clock.now
    runner.run(batch)
    waited = clock.now - started - outside - in_graphs
    assert waited == pytest.approx(HOST_SLOWDOWN * outside, abs=1e-5)


def test_host_slowed_runner_gives_the_references_outputs():
    model = build_model("moe", seed=2)
    backend = get_backend("emulated")
    reference = LayerStackRunner(model, buckets=(4, 8), graphs=GraphCapturer(backend))
    slowed = HostSlowedRunner(model, buckets=(4, 8), graphs=GraphCapturer(backend))
    for lengths in ([1], [3, 2], [8]):
        batch = ForwardBatch.from_lengths(lengths, vocab_size=model.config.vocab_size, seed=len(lengths),
                                          hidden_mode="full", all_logits=True)
        expected, got = reference.run(batch), slowed.run(batch)
        assert torch.equal(got.next_token_logits, expected.next_token_logits)
        assert torch.equal(got.hidden_states, expected.hidden_states)
    assert slowed.stats.replays == 3 and slowed.stats.eager_fallbacks == 0


# -- the bench step --------------------------------------------------------------------------------

RUNNER_VARIANTS = sorted(name for name in variants.__all__ if name.endswith("Runner"))


def load_driver():
    path = ROOT / ".ci" / "gpu" / "bench-variants"
    loader = importlib.machinery.SourceFileLoader("bench_variants", str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("bench_variants", loader))
    loader.exec_module(module)
    return module


def test_the_bench_step_runs_every_runner_variant_against_the_baseline_of_the_gpus_class():
    driver = load_driver()
    assert sorted(driver.VARIANTS) == RUNNER_VARIANTS == ["EagerFallbackRunner", "HostSlowedRunner", "SlowedRunner"]
    script = (ROOT / ".ci" / "gpu" / "run").read_text()
    step = re.search(r"^command\[bench\]='(.*?)'$", script, re.MULTILINE | re.DOTALL)[1]
    # the correct runner and the variants are gated against one baseline: the committed file of the class, or the
    # same-host measurement of the commit that recorded it
    assert re.search(r'runner_baseline=\$base-runner\.json;', step), step
    assert re.search(r'bench runner --quick .*--baseline "\$runner_baseline" &&', step, re.DOTALL), step
    assert re.search(r'"\$py" \.ci/gpu/bench-variants "\$out" -- --quick .*--baseline "\$runner_baseline"', step,
                     re.DOTALL), step
    assert re.search(r'git log -1 --format=%H -- "\$base-runner\.json"', step), step
    assert re.search(r'--record-baseline "\$here/same-host-runner\.json"', step), step
    # each class the step recognises has both baselines committed
    classes = re.findall(r"\*(H\d+)\*\) class=(h\d+) ;;", step)
    assert classes, step
    for name, label in classes:
        assert name.lower() == label
        for benchmark in ("runner", "gather"):
            assert (ROOT / "harness/bench/baselines" / f"{label}-{benchmark}.json").is_file(), (label, benchmark)
    # the correct runner and the variants are measured with the same settings
    assert "bench runner --quick --device cuda --graph-backend cuda" in step
    assert "-- --quick --device cuda --graph-backend cuda" in step


@pytest.mark.parametrize(("statuses", "expected"), [
    ([1, 1, 1], 0),
    ([1, 0, 1], 1),
    ([1, 2, "raise"], 1),
], ids=["all-caught", "one-passes", "usage-error-and-crash"])
def test_the_variants_driver_says_each_was_caught_and_fails_when_one_was_not(monkeypatch, tmp_path, capsys,
                                                                            statuses, expected):
    driver = load_driver()
    calls = []

    def main(argv):
        calls.append(argv)
        assert runner_bench._SHARED_MODELS is not None  # every variant reuses the models built once
        print(f"the bench output of {argv[-1]}")
        status = statuses[len(calls) - 1]
        if status == "raise":
            raise RuntimeError("the variant crashed")
        return status

    monkeypatch.setattr(command, "main", main)
    assert driver.main([str(tmp_path), "--", "--quick", "--baseline", "b.json"]) == expected
    assert [argv[-1] for argv in calls] == [f"runner=harness.bench.variants:{v}" for v in driver.VARIANTS]
    assert all(argv[:4] == ["runner", "--quick", "--baseline", "b.json"] for argv in calls)
    lines = capsys.readouterr().out.splitlines()
    for variant, status, line in zip(driver.VARIANTS, statuses, lines):
        if status == 1:
            assert line == f"{variant}: regression found, as it must be (exit 1)"
        else:
            assert line.startswith(f"{variant}: exit ") and "expected 1 (the baseline must catch this" in line
        log = (tmp_path / f"bench-{variant}.log").read_text()
        assert f"the bench output of runner=harness.bench.variants:{variant}" in log
    if "raise" in statuses:
        assert "a crash (traceback in the log)" in lines[-1]
        assert "RuntimeError: the variant crashed" in (tmp_path / f"bench-{driver.VARIANTS[-1]}.log").read_text()
    assert runner_bench._SHARED_MODELS is None  # given back after the variants


_FAKE_PYTHON = r'''#!/usr/bin/env bash
# Stands in for the GPU machine's python in the bench step: names an H100, records every call (with its folder),
# writes the file a --record-baseline names, and fails a call in the base tree where FAIL_BASE is set.
echo "$PWD :: $*" >> "$CALLS"
case "$*" in *get_device_name*) echo "NVIDIA H100 80GB HBM3"; exit 0 ;; esac
if [ -n "${FAIL_BASE:-}" ] && [ "$PWD" != "$REPO" ]; then exit 1; fi
previous=""
for argument in "$@"; do
  [ "$previous" = "--record-baseline" ] && echo '{}' > "$argument"
  previous=$argument
done
exit 0
'''


def _run_bench_step(tmp_path, *, cwd=ROOT, **env):
    """The bench step's command, as .ci/gpu/run runs it (its lines joined) in ``cwd``, with a stand-in python; its
    calls."""
    import os
    import subprocess

    script = (ROOT / ".ci" / "gpu" / "run").read_text()
    step = re.search(r"^command\[bench\]='(.*?)'$", script, re.MULTILINE | re.DOTALL)[1]
    fake = tmp_path / "python"
    fake.write_text(_FAKE_PYTHON)
    fake.chmod(0o755)
    out, site, calls = tmp_path / "out", tmp_path / "site", tmp_path / "calls"
    out.mkdir()
    site.mkdir()
    # The caller's own BENCH_BASE_TREE (the GPU check is run with one) must not choose the tree for these tests.
    inherited = {name: value for name, value in os.environ.items() if name != "BENCH_BASE_TREE"}
    environment = {**inherited, "py": str(fake), "out": str(out), "site": str(site), "CALLS": str(calls),
                   "REPO": str(cwd), **env}
    completed = subprocess.run(["bash", "-c", step.replace("\n", " ")], cwd=cwd, env=environment,
                               capture_output=True, text=True, timeout=120)
    return completed, calls.read_text().splitlines(), out


def test_the_bench_step_measures_the_baseline_commit_on_this_host_and_gates_against_it(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    completed, calls, out = _run_bench_step(tmp_path, BENCH_BASE_TREE=str(tree))
    assert completed.returncode == 0, completed.stdout + completed.stderr
    recorded = [call for call in calls if "--record-baseline" in call]
    assert len(recorded) == 1 and recorded[0].startswith(f"{tree} :: -m harness bench runner --quick"), calls
    assert f"--record-baseline {out}/same-host-runner.json" in recorded[0]
    gated = [call for call in calls if call.startswith(f"{ROOT} ::") and "--baseline" in call]
    assert len(gated) == 3, calls  # the runner, the gather, the variants
    assert all(f"--baseline {out}/same-host-runner.json" in call for call in gated if "gather" not in call), gated
    assert "gating against" in completed.stdout and "(same host)" in completed.stdout


def test_the_bench_step_falls_back_to_the_committed_baseline_when_the_base_commit_fails(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    completed, calls, out = _run_bench_step(tmp_path, BENCH_BASE_TREE=str(tree), FAIL_BASE="1")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    gated = [call for call in calls if call.startswith(f"{ROOT} ::") and "bench runner" in call]
    assert gated and "--baseline harness/bench/baselines/h100-runner.json" in gated[0], calls
    assert "did not run here" in completed.stdout


def test_the_bench_step_takes_the_baseline_commit_from_git_history(tmp_path):
    """In a repository of its own (a checkout's history differs from machine to machine, and a GPU machine's copy of
    the tree may have none): the baselines committed, then a later commit; the step unpacks the commit that last
    changed the runner baseline and measures there."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git is not installed: the step gates against the committed file without it (the fallback test)")
    repo = tmp_path / "repo"
    baselines = repo / "harness" / "bench" / "baselines"
    baselines.mkdir(parents=True)

    def git(*words):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *words], check=True,
                       capture_output=True)

    git("init", "-q")
    for name in ("h100-runner.json", "h100-gather.json"):
        (baselines / name).write_text('{"recorded": "first"}')
    git("add", "-A")
    git("commit", "-q", "-m", "baselines")
    (repo / "later.txt").write_text("a later change")
    git("add", "-A")
    git("commit", "-q", "-m", "later")
    completed, calls, out = _run_bench_step(tmp_path, cwd=repo)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    tree = tmp_path / "site" / "bench-base"
    unpacked = tree / "harness" / "bench" / "baselines" / "h100-runner.json"
    assert unpacked.is_file() and not (tree / "later.txt").exists(), "the baseline commit's tree, unpacked"
    assert any(call.startswith(f"{tree} :: -m harness bench runner") for call in calls), calls
