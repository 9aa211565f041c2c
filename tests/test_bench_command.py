"""The bench command end to end on the emulated backend: counts only, exit status from the baseline.

Small settings (one model, two batches) keep it to seconds; nothing here is timed. The oracle for
"regressed" is the construction of the variants: an eager-running runner launches exactly the eager
model's ops, so its run count must equal the baseline's eager count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shlex
from pathlib import Path

import pytest
import torch

from harness import locations
from harness.bench import command

SMALL = ["--device", "cpu", "--models", "dense", "--compositions", "1;2,2"]


@dataclasses.dataclass
class Completed:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def bench(capsys):
    """Run ``python -m harness bench ...`` in this process (a subprocess costs seconds of imports)."""

    def run(*arguments: str) -> Completed:
        capsys.readouterr()
        status = command.main(list(arguments))
        captured = capsys.readouterr()
        return Completed(status, captured.out, captured.err)

    return run


@pytest.fixture(scope="module")
def runner_baseline(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "runner.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert command.main(["runner", *SMALL, "--json", str(path)]) == 0
    assert "EMULATION" in out.getvalue()
    return path


def test_emulated_report_holds_counts_and_no_times(runner_baseline):
    report = json.loads(runner_baseline.read_text())
    assert report["environment"]["device_class"] == "cpu/emulated" and report["gate_version"] == 2
    assert {figure["kind"] for figure in report["figures"].values()} == {"count"}
    assert report["figures"]["dense/tiny/2+2/eager_fallbacks"]["value"] == 0
    # Four buckets captured, each a graph of attention breaks between segments.
    assert report["figures"]["dense/tiny/captures"]["value"] == 4


def test_rerun_passes_and_eager_fallback_fails(bench, runner_baseline):
    rerun = bench("runner", *SMALL, "--baseline", str(runner_baseline))
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "no regression" in rerun.stdout
    # 20% slower on the host path only: on the emulation, which compares counts, it is the reference (the
    # GPU run's gated host ratio is what catches it).
    host = bench("runner", *SMALL, "--baseline", str(runner_baseline),
                 "--impl", "runner=harness.bench.variants:HostSlowedRunner")
    assert host.returncode == 0, host.stdout + host.stderr
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
def test_bad_options_are_one_line(bench, arguments, message):
    completed = bench(*arguments)
    assert completed.returncode == 2
    assert message in completed.stderr and "Traceback" not in completed.stderr


def test_every_benchmark_lists_shared_and_own_options(bench):
    for name, own in (("runner", "--compositions"), ("gather", "--counts"), ("tolerance", "--dtypes")):
        with pytest.raises(SystemExit) as exited:
            bench(name, "--help")
        assert exited.value.code == 0
        text = command.build_parser()._subparsers._group_actions[0].choices[name].format_help()
        for option in ("--device", "--graph-backend", "--impl", "--json", "--repeat", "--baseline", "--record-baseline",
                       own):
            assert option in text, (name, option)


def test_plot_without_the_extra_is_a_usage_error_before_measuring(bench):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        completed = bench("runner", "--plot", "speedup.png")
        assert completed.returncode == 2
        assert "pip install 'llm-graph-harness[plot]'" in completed.stderr and "Traceback" not in completed.stderr
    else:
        pytest.skip("matplotlib is installed here: the missing-extra message cannot be shown")


def test_a_baseline_of_another_device_class_is_refused_before_measuring(bench, monkeypatch):
    from harness.bench import gather as gather_bench

    def measure(*args, **kwargs):
        raise AssertionError("measured before checking the baseline")

    monkeypatch.setattr(gather_bench, "run", measure)
    completed = bench("gather", "--device", "cpu", "--baseline", "harness/bench/baselines/h200-gather.json")
    assert completed.returncode == 2 and completed.stdout == ""
    assert "the baseline was measured on 'cuda:NVIDIA H200/cuda', this run on 'cpu/emulated'" in completed.stderr


@pytest.mark.parametrize(("benchmark", "recorded", "differing", "given"), [
    # a baseline recorded with --quick, a run without it
    ("runner", {"compositions": [[1], [8, 8, 8, 7]], "buckets": [4, 32]},
     ["buckets: baseline [4, 32], now [4, 8, 16, 32]", "compositions: baseline [[1], [8, 8, 8, 7]], now [[1], [3], "],
     "--quick"),
    ("runner", {"sizes": ["tiny", "large"], "dtype": "bfloat16"},
     ["dtype: baseline 'bfloat16', now 'float32'", "sizes: baseline ['tiny', 'large'], now ['tiny']"], "--sizes"),
    ("gather", {"hidden_size": 1024}, ["hidden_size: baseline 1024, now 4096"], "--hidden-size"),
], ids=["runner-quick", "runner-sizes-dtype", "gather-hidden-size"])
def test_a_baseline_with_other_settings_is_refused_before_measuring(bench, monkeypatch, tmp_path, benchmark, recorded,
                                                                     differing, given):
    module = command.importlib.import_module(command.BENCHMARKS[benchmark])
    measured = []
    monkeypatch.setattr(module, "run", lambda *args, **kwargs: measured.append(args))
    baseline = json.loads((locations.baselines_dir() / f"emulated-{benchmark}.json").read_text())
    baseline["settings"].update(recorded)
    path = tmp_path / "other.json"
    path.write_text(json.dumps(baseline))
    completed = bench(benchmark, "--device", "cpu", "--impl", f"{module.COMPONENTS[0]}=reference",
                      "--baseline", str(path))
    assert completed.returncode == 2 and completed.stdout == "" and measured == []
    (line,) = completed.stderr.splitlines()
    assert line.startswith("error: the baseline was measured with other settings (")
    for difference in differing:
        assert difference in line
    words = shlex.split(line.split("; to compare with it, run: ")[1])
    assert words[:5] == ["python", "-m", "harness", "bench", benchmark] and given in words
    assert words[-4:] == ["--impl", f"{module.COMPONENTS[0]}=reference", "--baseline", str(path)]
    # the command it names measures what the baseline holds
    assert module.settings_of(command.build_parser().parse_args(words[4:]), device=torch.device("cpu")) \
        == baseline["settings"]


def test_a_raising_implementation_is_one_line(bench, tmp_path, monkeypatch):
    (tmp_path / "raising_gather.py").write_text(
        "def gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf):\n"
        "    raise RuntimeError('kernel not built for this device')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    completed = bench("gather", "--device", "cpu", "--counts", "1", "--impl", "gather=raising_gather:gather")
    assert completed.returncode == 2 and "Traceback" not in completed.stderr
    assert completed.stderr.strip() == (
        "error: bench gather: the candidate implementation raised on its first call (index count 1, with_hidden=True): "
        "RuntimeError: kernel not built for this device (at raising_gather.py:2)")


TINY_GATHER = ["gather", "--device", "cpu", "--counts", "1", "--pool", "64", "--hidden-size", "64"]


@pytest.fixture
def engine_gather(tmp_path, monkeypatch) -> str:
    """A correct gather that is not the reference, as an engine's own module: one ``index_select`` per buffer."""
    (tmp_path / "my_engine_gather.py").write_text(
        "import torch\n\n\n"
        "def gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf):\n"
        "    def pick(buf):\n"
        "        return torch.index_select(buf, 0, indices)\n"
        "    hidden = None if hidden_states_buf is None else pick(hidden_states_buf)\n"
        "    return pick(topk_p_buf), pick(topk_index_buf), pick(output_tokens_buf), hidden\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "gather=my_engine_gather:gather"


def test_an_engine_records_its_own_baseline_then_passes_it(bench, tmp_path, engine_gather):
    path = tmp_path / "engine" / "baselines" / "gather-cpu.json"  # folders are made
    recorded = bench(*TINY_GATHER, "--impl", engine_gather, "--record-baseline", str(path))
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    report = json.loads(path.read_text())
    # a baseline is a --json report: the committed ones' format, of the implementation under test
    committed = json.loads((locations.baselines_dir() / "emulated-gather.json").read_text())
    assert report.keys() == committed.keys() and report["implementation"] == "my_engine_gather:gather"
    assert report["figures"]["candidate/hidden/1/launches"]["value"] == 4  # its own counts: one op per buffer
    gate = recorded.stdout.splitlines()[-1].split("then gate later runs with: ")[1]
    assert shlex.split(gate)[-4:] == ["--impl", engine_gather, "--baseline", str(path)]
    rerun = bench(*shlex.split(gate)[4:])  # the command it names, as printed
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "no regression: 6 gated findings" in rerun.stdout


def test_a_correct_engine_gather_fails_the_references_baseline(bench, engine_gather):
    """Why an engine records its own: the committed baseline holds the reference's counts (issue 33, row 2)."""
    completed = bench("gather", "--device", "cpu", "--impl", engine_gather, "--baseline", "emulated-gather")
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "changed    candidate/hidden/1/launches: 0 -> 4" in completed.stdout
    assert "REGRESSION: 9 of 18 gated findings" in completed.stdout


@pytest.mark.parametrize("where", ["with-baseline", "folder", "under-a-file"])
def test_record_baseline_is_refused_before_measuring(bench, monkeypatch, tmp_path, where):
    from harness.bench import gather as gather_bench

    monkeypatch.setattr(gather_bench, "run", lambda *args, **kwargs: pytest.fail("measured before refusing"))
    (tmp_path / "a-file").write_text("")
    arguments, message = {
        "with-baseline": (["--record-baseline", str(tmp_path / "new.json"), "--baseline", "emulated-gather"],
                          "record a baseline in one run, gate on it with --baseline in later runs"),
        "folder": (["--record-baseline", str(tmp_path)], f"{tmp_path} is a folder; name the JSON file to write"),
        "under-a-file": (["--record-baseline", str(tmp_path / "a-file" / "sub" / "gather.json")],
                         f"{tmp_path / 'a-file'} is a file, so nothing can be written under it"),
    }[where]
    completed = bench(*TINY_GATHER, *arguments)
    assert completed.returncode == 2 and completed.stdout == ""
    (line,) = completed.stderr.splitlines()
    assert line.startswith("error: --record-baseline ") and message in line
    assert not (tmp_path / "new.json").exists()
