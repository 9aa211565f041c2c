"""mutmut 3.8.1, run in a scratch copy of the checkout: the mutants of the chosen areas and their statuses.

mutmut is not a dependency of the harness: it is installed on first use into a folder of its own (``site``, with
``pip install --target``) and put on ``sys.path`` after the environment's packages, in a child process only
(``_mutmut_driver.py``). Nothing is written into the checkout but the gitignored scratch folder."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.errors import HarnessError
from harness.mutation.areas import Area, area_of_file
from harness.mutation.triage import Mutant, function_of, mutation_of, with_occurrences

__all__ = ["MUTMUT_REQUIREMENT", "RESULTS_FILE", "COPIED", "ensure_mutmut", "prepare_scratch", "mutmut_config",
           "run_mutmut", "read_results"]

#: The pin, as in pyproject's ``mutation`` extra and constraints.txt.
MUTMUT_REQUIREMENT = "mutmut==3.8.1"
#: What of the checkout the scratch copy holds: the package, the suites with their goldens and the pytest set-up.
COPIED = ("harness", "suites", "golden", "docs", "conftest.py", "pyproject.toml", "setup.py", "README.md")
_IGNORED = shutil.ignore_patterns("__pycache__", ".hypothesis", ".pytest_cache", "*.pyc")
#: The last run's mutants, their exit codes and diffs, in the scratch folder (read by ``mutate --show``).
RESULTS_FILE = "results.json"
_DRIVER = Path(__file__).with_name("_mutmut_driver.py")
# mutmut's exit codes by status (mutmut.stats.status_by_exit_code); anything else is "suspicious".
_STATUS_BY_EXIT_CODE = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 2: "check was interrupted by user",
                        None: "not checked", 33: "no tests", 34: "skipped", 35: "suspicious", 36: "timeout",
                        37: "caught by type check", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout",
                        -11: "segfault", -9: "segfault"}


def ensure_mutmut(site: Path, *, log: Callable[[str], None] = print) -> Path | None:
    """Where mutmut is: None where the environment has it (the ``mutation`` extra), else ``site``, where it is
    installed with pip on first use."""
    if importlib.util.find_spec("mutmut") is not None:
        return None
    if not (site / "mutmut" / "__init__.py").exists():
        log(f"installing {MUTMUT_REQUIREMENT} into {site} (once)")
        completed = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(site),
                                    MUTMUT_REQUIREMENT], capture_output=True, text=True)
        if completed.returncode:
            raise HarnessError(f"could not install {MUTMUT_REQUIREMENT} into {site}:\n{completed.stderr[-2000:]}")
    return site


def prepare_scratch(root: Path, scratch: Path, areas: Sequence[Area]) -> None:
    """A fresh copy of the checkout's ``COPIED`` parts in ``scratch``, configured for mutmut to mutate ``areas``."""
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    # The areas' test paths outside the copied folders (the harness's own positive controls of a backend, under
    # tests/), each with its folder's conftest.py.
    extra = {path for area in areas for path in area.suites if Path(path).parts[0] not in COPIED}
    extra |= {str(Path(path).parent / "conftest.py") for path in extra
              if (root / path).parent.joinpath("conftest.py").exists()}
    for name in (*COPIED, *sorted(extra)):
        source = root / name
        (scratch / name).parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, scratch / name, ignore=_IGNORED)
        elif source.exists():
            shutil.copy2(source, scratch / name)
    with (scratch / "pyproject.toml").open("a") as pyproject:
        pyproject.write(mutmut_config(areas))


def mutmut_config(areas: Sequence[Area]) -> str:
    """The ``[tool.mutmut]`` table: mutate the areas' files only, run their suites, one process per test run."""
    files = sorted({file for area in areas for file in area.files})
    suites = sorted({suite for area in areas for suite in area.suites})
    also_copy = [name for name in COPIED if name != "harness"]
    return ("\n\n[tool.mutmut]\n"
            'source_paths = ["harness/"]\n'
            f"only_mutate = {json.dumps(files)}\n"
            f"also_copy = {json.dumps(also_copy)}\n"
            f"pytest_add_cli_args_test_selection = {json.dumps(suites)}\n"
            # xdist off: mutmut maps tests to functions in its own process; no cache written into the copy. The ci
            # hypothesis profile, as the kill matrix's: derandomized examples, so a verdict is the same every run.
            'pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "no:xdist", "--hypothesis-profile", "ci"]\n')


def _driver(site: Path | None, scratch: Path, log_file: Path, *arguments: str) -> None:
    command = [sys.executable, str(_DRIVER), str(site) if site else "-", *arguments]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    with log_file.open("a") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        code = subprocess.run(command, cwd=scratch, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if code:
        tail = log_file.read_text()[-3000:]
        raise HarnessError(f"mutmut {arguments[0]} failed (exit {code}); the end of {log_file}:\n{tail}")


def _sample(names_by_file: dict[str, list[str]], areas: Sequence[Area], count: int, seed: int) -> list[str]:
    generator = random.Random(seed)
    chosen = []
    for area in areas:
        names = sorted(name for file in area.files for name in names_by_file.get(file, []))
        chosen += generator.sample(names, min(count, len(names)))
    return chosen


def run_mutmut(site: Path | None, scratch: Path, areas: Sequence[Area], *, jobs: int, sample: int | None = None,
               seed: int = 0) -> tuple[list[Mutant], dict[str, int]]:
    """Run mutmut over ``areas`` in ``scratch`` (prepared by :func:`prepare_scratch`): every mutant, or ``sample``
    of each area's picked with ``seed``. Returns the mutants run and each area's mutant count."""
    log_file = scratch / "mutmut.log"
    listing = scratch / "mutants.json"
    _driver(site, scratch, log_file, "list", str(listing))
    names_by_file: dict[str, list[str]] = json.loads(listing.read_text())
    totals = {area.name: sum(len(names_by_file.get(file, [])) for file in area.files) for area in areas}
    chosen = None if sample is None else _sample(names_by_file, areas, sample, seed)
    _driver(site, scratch, log_file, "run", str(jobs), *(chosen or []))
    _driver(site, scratch, log_file, "results", str(scratch / RESULTS_FILE))
    return read_results(scratch, chosen), totals


def read_results(scratch: Path, names: Sequence[str] | None = None) -> list[Mutant]:
    """The mutants of the last run in ``scratch`` (those of ``names`` where given), keyed as the triage files
    key them."""
    mutants = [Mutant(area=area_of_file(row["file"]).name, name=row["name"], function=function_of(row["name"]),
                      mutation=mutation_of(row["diff"]), diff=row["diff"],
                      status=_STATUS_BY_EXIT_CODE.get(row["exit_code"], "suspicious"))
               for row in json.loads((scratch / RESULTS_FILE).read_text())]
    mutants.sort(key=lambda m: (m.area, m.function, int(m.name.rpartition("__mutmut_")[2])))
    # occurrences count over every mutant of a function, so that a sample keys its mutants as a whole run does
    numbered = with_occurrences(mutants)
    wanted = None if names is None else set(names)
    return [m for m in numbered if wanted is None or m.name in wanted]
