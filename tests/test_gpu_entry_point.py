"""`.ci/gpu/run` is the one GPU check and `.github/workflows/gpu.yml` calls its steps by name: the two
cannot drift apart (every step of the script runs in the workflow, and the workflow runs nothing else)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "gpu" / "run"
WORKFLOW = ROOT / ".github" / "workflows" / "gpu.yml"
GOLDEN_WORKFLOW = ROOT / ".github" / "workflows" / "golden.yml"


def _script_steps() -> list[str]:
    return re.findall(r"^command\[(\w+)\]=", SCRIPT.read_text(), re.MULTILINE)


def _limits() -> dict[str, int]:
    found = re.findall(r"^limit\[(\w+)\]=(\d+)", SCRIPT.read_text(), re.MULTILINE)
    return {name: int(seconds) for name, seconds in found}


def test_the_workflow_runs_every_step_of_the_script_and_nothing_else():
    workflow = re.sub(r"^\s*#.*\n", "", WORKFLOW.read_text(), flags=re.MULTILINE)  # comments run nothing
    called = re.findall(r"\.ci/gpu/run [^\n]*--step (\w+)", workflow)
    assert sorted(called) == sorted(_script_steps()), (
        f"gpu.yml calls steps {sorted(called)}, .ci/gpu/run defines {sorted(_script_steps())}")
    # No check of its own beside the script's: pytest and the harness's checks run only through it.
    assert not re.search(r"bin/pytest|-m pytest|harness selfcheck|harness bench", workflow), (
        "gpu.yml runs a check of its own; make it a step of .ci/gpu/run")


def test_every_step_has_a_limit_and_the_limits_fit_one_device_call():
    text = SCRIPT.read_text()
    limits = _limits()
    assert set(limits) == set(_script_steps())
    default = re.search(r"\|\| steps=\(([\w ]+)\)", text)[1].split()  # opt-in steps (engines) run on their own
    # The whole check in one 10-minute call of a GPU machine, with half a minute for installing the wheels
    # and printing the table.
    assert sum(limits[step] for step in default) <= 9 * 60 + 30, (
        f"step limits {limits} of the default steps {default} exceed 9.5 minutes (one device call with set-up)")
    assert all(limit <= 590 for limit in limits.values()), "a step must fit one 10-minute device call with set-up"


def test_the_script_parses_and_refuses_an_unknown_argument():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    completed = subprocess.run([str(SCRIPT), "--bogus"], capture_output=True, text=True)
    assert completed.returncode == 2 and "unknown argument '--bogus'" in completed.stderr


# A stand-in interpreter: every call is logged; the checkout's registration (`"$py" - SITE`) writes a
# dist-info into the site it is given; torch "sees a GPU" and every step passes at once.
FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$FAKE_LOG"
if [ "$1" = - ]; then mkdir "$2/llm_graph_harness-0.dist-info" && echo "$2" > "$FAKE_LOG.site"; fi
exit 0
"""


def _run_with_a_fake_python(tmp_path: Path, scale: str, *steps: str) -> tuple[subprocess.CompletedProcess, Path]:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    (tmp_path / "tmp").mkdir()
    log = tmp_path / "calls.log"
    env = {**os.environ, "PYTHON": str(fake), "FAKE_LOG": str(log), "TMPDIR": str(tmp_path / "tmp"),
           "GPU_RUN_LIMIT_SCALE": scale, "GPU_RUN_WORKERS": "1"}
    args = [str(SCRIPT), "--out", str(tmp_path / "out")]
    for step in steps:
        args += ["--step", step]
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=120), log


@pytest.mark.parametrize("scale", ["abc", "0", "0.0", "-1", "1e3"])
def test_a_bad_limit_scale_is_refused_in_one_line_before_anything_is_installed(tmp_path, scale):
    completed, log = _run_with_a_fake_python(tmp_path, scale, "tests")
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert completed.stdout == ""
    assert len(completed.stderr.splitlines()) == 1 and "GPU_RUN_LIMIT_SCALE" in completed.stderr, completed.stderr
    # Refused first: no interpreter call (the wheels' install, the registration), no scratch site, no report folder.
    assert not log.exists(), log.read_text()
    assert not any((tmp_path / "tmp").iterdir()) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("scale", ["1", "1.5", "0.01"])
def test_the_limit_scale_multiplies_every_limit_and_the_scratch_site_is_removed(tmp_path, scale):
    limits = _limits()
    completed, log = _run_with_a_fake_python(tmp_path, scale, "tests", "suites")
    for step in ("tests", "suites"):
        scaled = math.ceil(limits[step] * Fraction(scale))  # rounded up to whole seconds
        assert f"=== {step} (limit {scaled} s)" in completed.stdout, completed.stdout + completed.stderr
    # The run's own scratch site held the checkout's registration and is gone after the run.
    site = Path((log.parent / (log.name + ".site")).read_text().strip())
    assert site.parent == tmp_path / "tmp" and site.name.startswith("gpu-site.")
    assert not site.exists() and not any((tmp_path / "tmp").iterdir())


ENGINES_SCRIPT = ROOT / ".ci" / "gpu" / "engine-conformance"
# What the engines step reads from the environment, which a test sets itself or not at all.
_ENGINE_VARIABLES = ("ENGINES", "COMPONENTS", "ENGINE_TIME_BUDGET", "ORDERS")
# A stand-in interpreter for the engines step: logs each call with its PYTHONPATH; the engine probes pass.
FAKE_ENGINE_PYTHON = """#!/bin/sh
echo "$PYTHONPATH|$*" >> "$FAKE_LOG"
exit 0
"""


def _run_engines(tmp_path: Path, **variables: str) -> tuple[subprocess.CompletedProcess, list[tuple[str, str]]]:
    fake = tmp_path / "python"
    fake.write_text(FAKE_ENGINE_PYTHON)
    fake.chmod(0o755)
    log = tmp_path / "calls.log"
    env = {**{k: v for k, v in os.environ.items() if k not in _ENGINE_VARIABLES},
           "PYTHON": str(fake), "FAKE_LOG": str(log), **variables}
    completed = subprocess.run([str(ENGINES_SCRIPT), str(tmp_path / "out")], capture_output=True, text=True, env=env,
                               timeout=120)
    calls = [tuple(line.split("|", 1)) for line in log.read_text().splitlines()] if log.exists() else []
    return completed, calls


def _conformance_calls(calls: list[tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """--impl -> (--time-limit, first PYTHONPATH entry) of each conformance run."""
    found = {}
    for path, arguments in calls:
        words = arguments.split()
        if words[:3] == ["-m", "harness", "conformance"]:
            found[words[words.index("--impl") + 1]] = (words[words.index("--time-limit") + 1], path.split(":")[0])
    return found


def test_the_engines_step_makes_each_engines_reports_from_its_folder_within_the_budget(tmp_path):
    for engine in ("sglang", "vllm"):
        (tmp_path / f"{engine}-modules" / engine).mkdir(parents=True)
    folders = {"SGLANG_MODULES": str(tmp_path / "sglang-modules"), "VLLM_MODULES": str(tmp_path / "vllm-modules"),
               "TRTLLM_MODULES": str(tmp_path / "no-such")}
    completed, calls = _run_engines(tmp_path, **folders, ENGINE_TIME_BUDGET="525")
    # every report of both engines, each from its own folder. Each limit is set as the report starts: what is left of
    # 525 s after the reproductions' reserve (SGLang's 40 s, vLLM's 15 s), 15 s a report still to run and the
    # expected times of the later reports (gather 70 s, runner 110 s, graphs 50 s), up to its own limit: graphs
    # 525 - 55 - 60 - 230; what a report leaves unused (here all but its second or so) goes to the later ones:
    # gather its own 210 (264 free), runner its own 240, vLLM's graphs its own 300.
    made = _conformance_calls(calls)
    assert list(made) == ["graphs=sglang", "gather=sglang", "runner=sglang", "graphs=vllm"], completed.stdout
    assert [path for _, path in made.values()] == [folders["SGLANG_MODULES"]] * 3 + [folders["VLLM_MODULES"]]
    for report, expected in {"graphs=sglang": 180, "gather=sglang": 210, "runner=sglang": 240}.items():
        # a second or two of the run's own time may come off the budget first
        assert expected - 3 <= int(made[report][0]) <= expected, (report, made[report], completed.stdout)
    assert made["graphs=vllm"][0] == "300", completed.stdout
    # each engine's reproductions of its components, from its own folder, after every report
    repros = [(arguments.split(), path.split(":")[0]) for path, arguments in calls if "-repros" in arguments]
    assert repros == [([".ci/gpu/sglang-repros", "graphs", "gather", "runner"], folders["SGLANG_MODULES"]),
                      ([".ci/gpu/vllm-repros", "graphs"], folders["VLLM_MODULES"])], calls
    assert [arguments for _, arguments in calls[-2:]] == [" ".join(words) for words, _ in repros]
    assert completed.returncode == 2  # the stand-in interpreter wrote no report
    # one engine: its own limit, no scaling, its reproductions only
    (tmp_path / "calls.log").unlink()
    completed, calls = _run_engines(tmp_path, **folders, ENGINE_TIME_BUDGET="525", ENGINES="vllm")
    assert _conformance_calls(calls) == {"graphs=vllm": ("300", folders["VLLM_MODULES"])}, completed.stdout
    assert [arguments for _, arguments in calls if "-repros" in arguments] == [".ci/gpu/vllm-repros graphs"]


def test_the_five_reports_of_the_h200_step_each_get_room_beyond_what_they_are_expected_to_take(tmp_path):
    """The engines step of .ci/gpu/run (525 s for five reports): the first reports are not held to a proportional
    share of the nominal limits (which left gather little above what it takes: CHANGELOG); each gets what the later
    reports' expected times leave."""
    folders = {}
    for engine, package in (("sglang", "sglang"), ("vllm", "vllm"), ("trtllm", "tensorrt_llm")):
        (tmp_path / f"{engine}-modules" / package).mkdir(parents=True)
        folders[f"{engine.upper()}_MODULES"] = str(tmp_path / f"{engine}-modules")
    completed, calls = _run_engines(tmp_path, **folders, ENGINE_TIME_BUDGET="525")
    made = {report: int(limit) for report, (limit, _) in _conformance_calls(calls).items()}
    assert list(made) == ["graphs=sglang", "gather=sglang", "runner=sglang", "graphs=vllm", "graphs=trtllm"], made
    # graphs: 525 - 70 (reserves) - 5 * 15 - (70 + 110 + 50 + 50); gather: 525 - 70 - 4 * 15 - (110 + 50 + 50)
    assert 97 <= made["graphs=sglang"] <= 100 and 182 <= made["gather=sglang"] <= 185, (made, completed.stdout)
    assert (made["runner=sglang"], made["graphs=vllm"], made["graphs=trtllm"]) == (240, 300, 300), made


def test_an_installed_sglangs_runner_report_takes_the_stand_ins_of_a_folder(tmp_path):
    """The scheduled job judges the installed SGLang (its compiled ops, no stand-in) but its runner adapter needs
    the data-path stand-ins, which only a folder made by extract-sglang has: that report alone runs from it, and
    none is made where there is no such folder."""
    (tmp_path / "runner-modules" / "sglang").mkdir(parents=True)
    folders = {"SGLANG_MODULES": "", "SGLANG_RUNNER_MODULES": str(tmp_path / "runner-modules"), "PYTHONPATH": ""}
    completed, calls = _run_engines(tmp_path, **folders, ENGINES="sglang")
    made = _conformance_calls(calls)
    assert made == {"graphs=sglang": ("300", ""), "gather=sglang": ("210", ""),
                    "runner=sglang": ("240", folders["SGLANG_RUNNER_MODULES"])}, completed.stdout
    (tmp_path / "calls.log").unlink()
    completed, calls = _run_engines(tmp_path, **{**folders, "SGLANG_RUNNER_MODULES": str(tmp_path / "no-such")},
                                    ENGINES="sglang")
    assert list(_conformance_calls(calls)) == ["graphs=sglang", "gather=sglang"], completed.stdout


def test_the_engines_step_says_how_to_make_a_missing_engines_modules(tmp_path):
    (tmp_path / "sglang-modules" / "sglang").mkdir(parents=True)
    folders = {"SGLANG_MODULES": str(tmp_path / "sglang-modules"), "VLLM_MODULES": str(tmp_path / "no-such"),
               "TRTLLM_MODULES": str(tmp_path / "no-such")}
    completed, calls = _run_engines(tmp_path, **folders, COMPONENTS="graphs")
    # not asked for by name: skipped with the line, SGLang's report made
    assert f"no vllm modules in {tmp_path / 'no-such'}: run .ci/gpu/extract-vllm WHEEL" in completed.stdout
    assert f"no trtllm modules in {tmp_path / 'no-such'}: run .ci/gpu/extract-trtllm SOURCE COMMIT" in completed.stdout
    assert list(_conformance_calls(calls)) == ["graphs=sglang"]
    completed, _ = _run_engines(tmp_path, **folders, ENGINES="vllm")
    assert completed.returncode == 2 and "run .ci/gpu/extract-vllm WHEEL" in completed.stdout
    assert "no engine report to make" in completed.stdout


def test_the_engines_step_finds_trtllms_package_in_its_folder(tmp_path):
    """TensorRT-LLM's folder holds the package tensorrt_llm (not one named as the engine); its report is the graphs
    one, from that folder, and cuda-python is probed for it as for SGLang."""
    (tmp_path / "trtllm-modules" / "tensorrt_llm").mkdir(parents=True)
    folders = {"TRTLLM_MODULES": str(tmp_path / "trtllm-modules")}
    completed, calls = _run_engines(tmp_path, **folders, ENGINES="trtllm", ENGINE_TIME_BUDGET="525")
    assert _conformance_calls(calls) == {"graphs=trtllm": ("300", folders["TRTLLM_MODULES"])}, completed.stdout
    assert any("from harness.adapters.trtllm import engine_version" in arguments for _, arguments in calls)
    assert any("from cuda.bindings import runtime" in arguments for _, arguments in calls)
    (tmp_path / "trtllm-modules" / "tensorrt_llm").rmdir()
    (tmp_path / "trtllm-modules" / "trtllm").mkdir()
    completed, _ = _run_engines(tmp_path, **folders, ENGINES="trtllm")
    assert completed.returncode == 2 and f"no trtllm modules in {folders['TRTLLM_MODULES']}" in completed.stdout


def test_the_gpu_jobs_pin_the_torch_the_h200_baselines_were_recorded_on():
    recorded = {json.loads(path.read_text())["environment"]["torch"].split("+")[0]
                for path in sorted((ROOT / "harness" / "bench" / "baselines").glob("h200-*.json"))}
    assert len(recorded) == 1, f"the H200 baselines were recorded on different torch versions: {recorded}"
    for workflow in (WORKFLOW, GOLDEN_WORKFLOW):
        text = workflow.read_text()
        pins = re.findall(r'^  GPU_TORCH_VERSION: "([^"]+)"$', text, re.MULTILINE)
        assert pins == list(recorded), (
            f"{workflow.name}: GPU_TORCH_VERSION {pins}, the H200 baselines record torch {recorded}")
        assert re.search(r'"\$VENV/bin/pip" install (-c constraints\.txt )?"torch==\$GPU_TORCH_VERSION"', text), (
            f"{workflow.name} never installs torch==$GPU_TORCH_VERSION")
    # Every venv of gpu.yml takes the pin, the sglang job's excepted (its torch is the one SGLang requires).
    for install in re.findall(r'"\$VENV/bin/pip" install [^\n]*', WORKFLOW.read_text()):
        assert "torch==$GPU_TORCH_VERSION" in install or "sglang==" in install, (
            f"gpu.yml: a venv without the pinned torch: {install}")


def test_the_engines_step_gives_later_reports_what_earlier_ones_left_and_the_reproductions_what_is_left(tmp_path):
    """Limits are set as each report starts, from what is left of the budget: a report that took its time leaves less
    to the next (here 3 s of SGLang's graphs report), and the reproductions get the rest, at least their reserve."""
    (tmp_path / "sglang-modules" / "sglang").mkdir(parents=True)
    fake = FAKE_ENGINE_PYTHON.replace('exit 0', 'case "$*" in *graphs=sglang*) sleep 3 ;; esac\nexit 0')
    (tmp_path / "python").write_text(fake)
    log = tmp_path / "calls.log"
    env = {**{k: v for k, v in os.environ.items() if k not in _ENGINE_VARIABLES},
           "PYTHON": str(tmp_path / "python"), "FAKE_LOG": str(log), "SGLANG_MODULES": str(tmp_path / "sglang-modules"),
           "ENGINES": "sglang", "COMPONENTS": "graphs gather", "ENGINE_TIME_BUDGET": "100"}
    (tmp_path / "python").chmod(0o755)
    completed = subprocess.run([str(ENGINES_SCRIPT), str(tmp_path / "out")], capture_output=True, text=True, env=env,
                               timeout=120)
    made = _conformance_calls([tuple(line.split("|", 1)) for line in log.read_text().splitlines()])
    # graphs: 100 - 40 - 2 * 15 leaves 30 s, less than its expected 50 s and gather's 70 s: its share 50 * 30 / 120 is
    # 12, below the floor of 30; gather: the 45 s left after graphs' 15 s, less the 3 s graphs took
    assert made["graphs=sglang"][0] == "30", completed.stdout
    assert 40 <= int(made["gather=sglang"][0]) <= 42, completed.stdout
    # the reproductions: what is left of 100 s after about 3 s of reports (below their limit of 120 s)
    repro_line = next(line for line in completed.stdout.splitlines() if line.startswith("--- minimal reproductions"))
    assert 95 <= int(repro_line.split("limit ")[1].split()[0]) <= 97, repro_line


def test_the_installed_no_graph_packages_are_reported_only_where_engines_names_them(tmp_path):
    """breakable-cuda-graphs and piecewise-cuda-graphs (``graphs=bcg``, ``graphs=pcg``) are installed packages (their
    variables empty by default): not in the default reports, whose limits the step's tests fix; where ENGINES names
    them, each is one graphs report on the PYTHONPATH as it is, its version probed through its adapter, no
    cuda-python probe and no reproductions (they have none)."""
    folders = {"SGLANG_MODULES": str(tmp_path / "no-such"), "VLLM_MODULES": str(tmp_path / "no-such"),
               "TRTLLM_MODULES": str(tmp_path / "no-such"), "PYTHONPATH": ""}
    completed, calls = _run_engines(tmp_path, **folders)
    assert _conformance_calls(calls) == {} and "no engine report to make" in completed.stdout
    (tmp_path / "calls.log").unlink(missing_ok=True)
    completed, calls = _run_engines(tmp_path, **folders, ENGINES="bcg pcg", ENGINE_TIME_BUDGET="525")
    made = _conformance_calls(calls)
    assert list(made) == ["graphs=bcg", "graphs=pcg"], completed.stdout
    assert all(path == "" for _, path in made.values()), made
    # the first leaves the second its expected 50 s and 15 s of starting; the second its own limit
    assert 300 - 3 <= int(made["graphs=bcg"][0]) <= 300 and made["graphs=pcg"][0] == "300", made
    for engine in ("bcg", "pcg"):
        assert any(f"from harness.adapters.{engine} import engine_version" in arguments for _, arguments in calls)
    assert not any("cuda.bindings" in arguments or "-repros" in arguments for _, arguments in calls), calls
    # a folder holding the unzipped wheel's module (a single file, not a package folder) comes first on the path
    (tmp_path / "bcg-site").mkdir()
    (tmp_path / "bcg-site" / "breakable_cuda_graphs.py").write_text("")
    (tmp_path / "calls.log").unlink(missing_ok=True)
    completed, calls = _run_engines(tmp_path, **folders, ENGINES="bcg", BCG_MODULES=str(tmp_path / "bcg-site"))
    assert _conformance_calls(calls) == {"graphs=bcg": ("300", str(tmp_path / "bcg-site"))}, completed.stdout
    completed, _ = _run_engines(tmp_path, **folders, ENGINES="pcg", PCG_MODULES=str(tmp_path / "bcg-site"))
    assert completed.returncode == 2 and "run unzip -d " in completed.stdout
    assert "piecewise_cuda_graphs-0.1.0-py3-none-any.whl" in completed.stdout


# A stand-in interpreter that also writes the report files a conformance run would (empty), so the step goes on.
FAKE_REPORTING_PYTHON = """#!/bin/sh
echo "$PYTHONPATH|$*" >> "$FAKE_LOG"
impl= out= previous=
for word in "$@"; do
  [ "$previous" = --impl ] && impl=$word
  [ "$previous" = --out ] && out=$word
  previous=$word
done
if [ -n "$impl" ]; then
  touch "$out/conformance-${impl%=*}-${impl#*=}.md" "$out/conformance-${impl%=*}-${impl#*=}.json"
fi
exit 0
"""


def test_a_second_order_records_each_report_again_reversed_and_diffs_it_against_the_first(tmp_path):
    (tmp_path / "vllm-modules" / "vllm").mkdir(parents=True)
    fake = tmp_path / "python"
    fake.write_text(FAKE_REPORTING_PYTHON)
    fake.chmod(0o755)
    log, out = tmp_path / "calls.log", tmp_path / "out"
    env = {**{k: v for k, v in os.environ.items() if k not in _ENGINE_VARIABLES},
           "PYTHON": str(fake), "FAKE_LOG": str(log), "VLLM_MODULES": str(tmp_path / "vllm-modules"),
           "ENGINES": "vllm", "ORDERS": "collected reversed"}
    completed = subprocess.run([str(ENGINES_SCRIPT), str(out)], capture_output=True, text=True, env=env, timeout=120)
    calls = [line.split("|", 1)[1].split() for line in log.read_text().splitlines()]
    runs = [words for words in calls if words[:3] == ["-m", "harness", "conformance"]]
    orders = [(words[words.index("--test-order") + 1], words[words.index("--jobs") + 1],
               words[words.index("--out") + 1]) for words in runs]
    assert orders == [("collected", "4", str(out)), ("reversed", "3", str(out / "reversed"))], completed.stdout
    diffs = [words for words in calls if words[:3] == ["-m", "harness", "conformance-diff"]]
    assert diffs == [["-m", "harness", "conformance-diff", str(out / "conformance-graphs-vllm.json"),
                      str(out / "reversed" / "conformance-graphs-vllm.json"), "--expect-identical"]], calls
    assert completed.returncode == 0, completed.stdout + completed.stderr
