"""The harness as an engine's CI uses it: the built wheel, installed into a fresh virtual environment,
run from a directory with no checkout on the path.

One build and one venv per pytest process, shared by the checks; the suite runs dominate (the packaged gather
suite with the compiled reference compiles: that check is ``slow_child``, left out of a plain run of tests/). The
venv does not
reinstall torch and the other dependencies: a folder of links to the current environment's packages
(everything but the harness itself) is put on its path, so the wheel is installed with ``--no-deps``
and what is tested is the wheel's own content. That the wheel's metadata asks for those dependencies
is checked on the metadata.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# An engine's module, outside the harness: a correct gather in plain torch, and one that is off by one
# in one element of one output (a bug the suite must report with its usual failure output).
_ENGINE_OPS = '''
def gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf=None):
    hidden = None if hidden_states_buf is None else hidden_states_buf[indices]
    return topk_p_buf[indices], topk_index_buf[indices], output_tokens_buf[indices], hidden


def broken_gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf=None):
    topk_p, topk_index, tokens, hidden = gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf,
                                                hidden_states_buf)
    if topk_p.numel():
        topk_p.view(-1)[-1] += 1
    return topk_p, topk_index, tokens, hidden
'''

# The documented one-file conftest.py that collects the gather suite inside an engine's own tests.
_ENGINE_CONFTEST = '''from harness.plugin import collect_suite

pytest_collect_file = collect_suite("gather")
'''

# The test is about packaging: every run on the CPU and the emulated backend, on a GPU runner too.
_CPU = ["--device", "cpu", "--graph-backend", "emulated"]
_IGNORED = shutil.ignore_patterns(".git", ".venv", ".whl", ".sglang", ".vllm", "build", "dist", "*.egg-info",
                                  "__pycache__", ".hypothesis", ".pytest_cache", ".harness_cache", ".ci")


def _run(command: list[str], *, cwd: Path, env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _readme_wheel_commands() -> tuple[list[str], str]:
    """The README's build of the harness's wheel from a checkout (its engine's-CI commands and its workflow write the
    same line) and the wheel file its install names: the build's words, the file's pattern."""
    text = (ROOT / "README.md").read_text()
    builds = set(re.findall(r"^ *(pip wheel [^#\n]*?) *$", text, re.MULTILINE))
    installs = set(re.findall(r"^ *pip install (?:-e \. )?(dist/llm_graph_harness-\S*\.whl)$", text, re.MULTILINE))
    assert len(builds) == 1 and len(installs) == 1, ("the README builds and installs the wheel in one way",
                                                     builds, installs)
    return shlex.split(builds.pop()), installs.pop()


def _build_wheel(tmp_path_factory) -> Path:
    """The wheel, built by the README's command from a copy of the source tree named as the README's checkout (a
    stale build/ of the checkout cannot leak in), in the folder the README runs it from."""
    command, installed = _readme_wheel_commands()
    assert command[:2] == ["pip", "wheel"], command
    base = tmp_path_factory.mktemp("engine-repository")
    shutil.copytree(ROOT, base / command[-1], ignore=_IGNORED)
    pip = [sys.executable, "-m", *command]  # the pip of this interpreter, whose environment has the dependencies
    completed = _run(pip, cwd=base, env=dict(os.environ))
    if completed.returncode != 0:
        # Where no package index is reachable (a GPU runner), pip cannot make the isolated build environment the
        # command asks for: the same command then builds with this environment's setuptools (pip reads
        # PIP_NO_BUILD_ISOLATION=0 as --no-build-isolation).
        completed = _run(pip, cwd=base, env={**os.environ, "PIP_NO_BUILD_ISOLATION": "0"})
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    (built,) = base.glob(installed)
    return built


def _dependency_folders() -> list[Path]:
    """Where this interpreter finds its packages (site-packages, and a PYTHONPATH target such as the GPU
    runner's), in import order, without the checkout."""
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    folders = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        in_checkout = path.is_relative_to(ROOT) and path.name not in ("site-packages", "dist-packages")  # not a venv's
        if path.is_dir() and not in_checkout and not path.is_relative_to(stdlib):
            folders.append(path)
    return folders


def _install(wheel: Path, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A fresh venv with the wheel installed: its python, and the environment to run it in from an
    empty folder (nothing of the checkout importable; the engine's module on PYTHONPATH, as its CI has it)."""
    base = tmp_path_factory.mktemp("engine-ci")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # Named site-packages, as the folders it links to are: hypothesis takes a module outside a folder of that
    # name for the project's own code and parses its source for constants (in every child pytest here: torch's
    # and transformers' whole trees, most of each run's time, since each runs in a fresh folder).
    links = base / "dependencies" / "site-packages"
    links.mkdir(parents=True)
    for folder in _dependency_folders():
        for entry in folder.iterdir():
            name = entry.name
            if (links / name).exists() or name.endswith(".pth") or name.startswith(
                    ("__editable__", "llm_graph_harness", "harness", "pip", "__pycache__", "_pytest_")):
                continue  # the harness itself comes from the wheel; the rest is what its dependencies need
            (links / name).symlink_to(entry)
    (site / "harness-test-dependencies.pth").write_text(f"{links}\n")
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")
           and not key.startswith(("PYTEST_XDIST", "HYPOTHESIS"))}
    completed = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                     cwd=base, env=env)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    engine = base / "engine"
    (engine / "tests" / "harness_gather").mkdir(parents=True)
    (engine / "engine_ops.py").write_text(_ENGINE_OPS)
    (engine / "tests" / "harness_gather" / "conftest.py").write_text(_ENGINE_CONFTEST)
    return python, {**env, "PYTHONPATH": str(engine)}


def _check_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for suite in (ROOT / "suites").rglob("*.py"):
        assert f"harness/suites/{suite.relative_to(ROOT / 'suites').as_posix()}" in names
    for golden in (ROOT / "golden").rglob("*.json"):
        assert f"harness/golden/{golden.relative_to(ROOT / 'golden').as_posix()}" in names
    for baseline in (ROOT / "harness" / "bench" / "baselines").glob("*.json"):
        assert f"harness/bench/baselines/{baseline.name}" in names
    assert "harness/py.typed" in names
    metadata = zipfile.ZipFile(wheel)
    dist_info = next(name.split("/")[0] for name in names if name.endswith(".dist-info/METADATA"))
    entry_points = metadata.read(f"{dist_info}/entry_points.txt").decode()
    assert re.search(r"^\[pytest11\]\nharness\.plugin = harness\.plugin$", entry_points, re.MULTILINE)
    requires = metadata.read(f"{dist_info}/METADATA").decode()
    for dependency in ("torch", "pytest", "hypothesis", "syrupy"):
        assert re.search(rf"^Requires-Dist: {dependency}\b", requires, re.MULTILINE), dependency


def _check_reference_passes_the_packaged_suite(python: Path, env: dict[str, str], tmp_path: Path) -> None:
    completed = _run([str(python), "-m", "pytest", "--pyargs", "harness.suites.gather", "-p", "no:cacheprovider",
                      *_CPU],
                     cwd=tmp_path, env=env)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-5000:]
    assert re.search(r"^  gather +\d+ passed$", output, re.MULTILINE), output[-3000:]  # the run report, by component
    assert re.search(r"^\d+ snapshots? passed", output, re.MULTILINE), output[-3000:]  # the packaged golden was found


def _check_outside_modules(python: Path, env: dict[str, str], tmp_path: Path) -> None:
    engine = Path(env["PYTHONPATH"])
    # A few contract cases are enough to show an outside module passes: the whole suite runs on the reference.
    good = _run([str(python), "-m", "pytest", "--pyargs", "harness.suites.gather.test_contract",
                 "-p", "no:cacheprovider", "--impl", "gather=engine_ops:gather", "-q",
                 "-k", "typical or strided or every_dtype", *_CPU],
                cwd=tmp_path, env=env)
    assert good.returncode == 0, (good.stdout + good.stderr)[-5000:]
    # The broken one through the engine's own test tree (the one-file conftest.py), stopping at its first failure,
    # with the engine's folder on PYTHONPATH as a user types it there: relative.
    broken = _run([str(python), "-m", "pytest", "tests", "-p", "no:cacheprovider", "-x",
                   "--impl", "gather=engine_ops:broken_gather", *_CPU], cwd=engine, env={**env, "PYTHONPATH": "."})
    output = broken.stdout + broken.stderr
    assert broken.returncode == 1, output[-5000:]
    assert "MismatchError" in output, output[-5000:]
    assert "implementations: {'gather': 'engine_ops:broken_gather'}" in output, output[-5000:]
    # The reproduce line carries PYTHONPATH and the interpreter (harness.plugin.failures.reproduce_command).
    reproduce = re.search(r"^-+ reproduce -+\n(.* -m pytest .*)$", output, re.MULTILINE)
    assert reproduce, output[-5000:]
    assert "site-packages/harness/suites/gather/test_" in reproduce[1]
    assert "--impl gather=engine_ops:broken_gather" in reproduce[1]
    # pasted into a new shell in another folder, it reruns the failure: PYTHONPATH absolute, no --rootdir of the
    # engine's folder, the installed suite file by its absolute path
    assert reproduce[1].startswith(f"PYTHONPATH={engine.resolve()} ") and "--rootdir" not in reproduce[1]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    pasted = _run(["bash", "-c", reproduce[1]], cwd=elsewhere,
                  env={key: value for key, value in env.items() if key != "PYTHONPATH"})
    assert pasted.returncode == 1 and "MismatchError" in pasted.stdout, (pasted.stdout + pasted.stderr)[-5000:]
    # The suite's conftest, imported before collection as the path argument's, sets off no warning the harness causes
    # (torch's deprecations: the engine's run has no harness ini to filter them; harness.plugin.warning_filters).
    assert "DeprecationWarning" not in pasted.stdout, pasted.stdout[-5000:]
    assert re.search(r"^  gather +1 failed$", output, re.MULTILINE), output[-3000:]


def _check_list_and_location(python: Path, env: dict[str, str], tmp_path: Path) -> None:
    completed = _run([str(python), "-m", "harness", "list"], cwd=tmp_path, env=env)
    assert completed.returncode == 0, completed.stderr[-3000:]
    for name in ("graphs", "runner", "gather"):
        assert re.search(rf"^{name}: ", completed.stdout, re.MULTILINE), completed.stdout
    located = _run([str(python), "-c", "import harness, harness.locations as l; "
                                      "print(harness.__file__); print(l.suites_dir()); print(l.is_checkout())"],
                   cwd=tmp_path, env=env)
    module, suites, checkout = located.stdout.split()
    assert not Path(module).is_relative_to(ROOT) and Path(suites) == Path(module).parent / "suites"
    assert checkout == "False"


def _check_selfcheck_run(python: Path, env: dict[str, str], tmp_path: Path) -> None:
    """What ``python -m harness selfcheck`` does per mutant, from the wheel: node ids match the shipped kill
    matrix (so a mutant's killing test runs first) and the verdict is read as in a checkout."""
    script = ("from harness import impls, locations, selfcheck\n"
              "root = locations.project_root()\n"
              "impl = impls.load('gather', 'mutant:aliases-full-arange')\n"
              "hint = selfcheck.read_hints(root)[('gather', impl.name, 'emulated')]\n"
              "outcome = selfcheck.run_one(impl, graph_backend='emulated', device='cpu', root=root, first=hint)\n"
              "print(outcome.verdict, outcome.first_failure == hint, hint)\n")
    completed = _run([str(python), "-c", script], cwd=tmp_path, env=env)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.split()[:2] == ["killed", "True"], completed.stdout


def _installed_package(python: Path) -> Path:
    (package,) = (python.parent.parent / "lib").glob("python*/site-packages/harness")
    return package


def _tree(folder: Path) -> dict[str, tuple[int, int] | None]:
    """Every file under ``folder`` with its size and modification time, every folder by its name; but for bytecode
    caches (``__pycache__``): pytest writes the modules it rewrites there beside every plugin's (xdist's and
    syrupy's too), Python its own, neither the harness."""
    tree: dict[str, tuple[int, int] | None] = {}
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        if "__pycache__" not in relative.parts:
            status = path.lstat()
            tree[relative.as_posix()] = None if path.is_dir() else (status.st_size, status.st_mtime_ns)
    return tree


def _check_nothing_written(before: dict[str, tuple[int, int] | None], package: Path, *, by: str) -> None:
    after = _tree(package)
    added, removed = sorted(set(after) - set(before)), sorted(set(before) - set(after))
    changed = sorted(name for name in set(before) & set(after) if before[name] != after[name])
    assert not (added or removed or changed), (
        f"{by} wrote into the installed package {package}: {len(added)} added {added[:8]}, {len(removed)} removed "
        f"{removed[:8]}, {len(changed)} changed {changed[:8]}")


def _check_a_child_run_writes_into_the_engines_folder(python: Path, env: dict[str, str], tmp_path: Path) -> None:
    """A child run of selfcheck's (in the suites' root, the installed package) of the engine's broken gather through a
    hypothesis test: hypothesis caches the constants of the engine's module, which is outside site-packages, in its
    storage, which is in the folder the run was started from, and nothing goes into the package."""
    package = _installed_package(python)
    before = _tree(package)
    killing = "suites/gather/test_contract.py::test_matches_eager_oracle_over_the_contract[no-hidden]"
    script = ("from harness import impls, locations, selfcheck\n"
              "impl = impls.load('gather', 'engine_ops:broken_gather')\n"
              "outcome = selfcheck.run_one(impl, graph_backend='emulated', device='cpu', "
              f"root=locations.project_root(), first={killing!r})\n"
              "print(outcome.verdict, outcome.first_failure)\n")
    completed = _run([str(python), "-c", script], cwd=tmp_path, env=env)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.split() == ["killed", killing], completed.stdout
    _check_nothing_written(before, package, by="a selfcheck child run")
    assert (tmp_path / ".hypothesis").is_dir()


def _check_selfcheck_writes_into_the_engines_folder(python: Path, env: dict[str, str], tmp_path: Path) -> None:
    """``python -m harness selfcheck`` from an engine's (empty) folder: its children's hypothesis storage and its
    hints cache go there, nothing into the installed package."""
    package = _installed_package(python)
    before = _tree(package)
    completed = _run([str(python), "-m", "harness", "selfcheck", "--component", "gather", *_CPU], cwd=tmp_path,
                     env=env)
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-5000:]
    _check_nothing_written(before, package, by="python -m harness selfcheck")
    assert (tmp_path / ".hypothesis").is_dir()
    hints = json.loads((tmp_path / ".harness_cache" / "selfcheck-hints.json").read_text())
    assert {entry["component"] for entry in hints["kills"]} == {"gather"}, hints


# The limits are wall time on a shared machine, which a loaded small machine stretches far beyond the tests' CPU
# time.
pytestmark = pytest.mark.timeout(1200)


# One wheel and one venv per pytest process (under pytest-xdist, per worker that runs a test of this file: building
# and installing take seconds, the checks below the rest), shared by the checks, which xdist can then spread.
@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_wheel(tmp_path_factory)


@pytest.fixture(scope="session")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    return _install(wheel, tmp_path_factory)


def test_the_wheel_carries_the_suites_goldens_baselines_and_plugin(wheel: Path):
    _check_contents(wheel)


def test_the_readmes_build_makes_the_wheel_these_checks_install(wheel: Path, installed):
    """The README's own commands, not a build of the tests' own: ``wheel`` is what its ``pip wheel`` line made, the
    file its install line names, and that is what is installed here."""
    _, pattern = _readme_wheel_commands()
    assert wheel.match(pattern), (wheel, pattern)
    python, env = installed
    completed = _run([str(python), "-m", "harness", "--version"], cwd=wheel.parent, env=env)
    assert completed.stdout.split() == ["llm-graph-harness", wheel.name.split("-")[1]], completed.stdout


def test_the_installed_harness_lists_its_components_from_its_own_folder(installed, tmp_path: Path):
    _check_list_and_location(*installed, tmp_path)


@pytest.mark.long_running
def test_an_engines_modules_run_under_the_installed_suites_and_reproduce(installed, tmp_path: Path):
    _check_outside_modules(*installed, tmp_path)


def test_a_selfcheck_run_from_the_wheel_starts_with_the_shipped_killing_test(installed, tmp_path: Path):
    _check_selfcheck_run(*installed, tmp_path)


def test_a_selfcheck_child_run_from_the_wheel_writes_nothing_into_the_installed_package(installed, tmp_path: Path):
    _check_a_child_run_writes_into_the_engines_folder(*installed, tmp_path)


# The kill matrix of one component, its reference's whole suite included: slow_child, as the next one.
@pytest.mark.slow_child
@pytest.mark.long_running
def test_selfcheck_from_an_engines_folder_writes_nothing_into_the_installed_package(installed, tmp_path: Path):
    _check_selfcheck_writes_into_the_engines_folder(*installed, tmp_path)


# The whole packaged gather suite on the reference, compiles included: most of this file's CPU time (a minute
# and more on 2 cores), so a plain `pytest tests/` leaves it out (slow_child: tests/conftest.py); .ci/run and
# ci.yml run it.
@pytest.mark.slow_child
@pytest.mark.long_running
def test_the_reference_passes_the_whole_packaged_suite(installed, tmp_path: Path):
    _check_reference_passes_the_packaged_suite(*installed, tmp_path)
