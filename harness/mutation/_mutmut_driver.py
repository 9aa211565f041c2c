"""Runs mutmut 3.8.1 in a scratch copy of the checkout; executed as a script, never imported by the harness.

SITE is the folder mutmut was installed into, or ``-`` where the environment has it.
``python _mutmut_driver.py SITE list OUT``: generate the mutants, write ``{file: [mutant name, ...]}`` to OUT.
``python _mutmut_driver.py SITE run JOBS [NAME...]``: run the tests against the mutants (all, or those named).
``python _mutmut_driver.py SITE results OUT``: write ``[{file, name, exit_code, diff}, ...]`` to OUT.

It imports no module of the harness itself: mutmut puts its mutated copy (``mutants/``) first on ``sys.path`` and
every ``harness`` module the tests import must come from there. ``harness.suites`` is mapped to the copy's
``suites/`` too: an editable install's finder would otherwise hand out the original checkout's suites."""

import importlib.abc
import importlib.util
import json
import os
import sys
from pathlib import Path

del sys.path[0]  # this script's folder (harness/mutation of the original checkout) must not shadow anything
_site = sys.argv.pop(1)
if _site != "-":  # "-": the environment has mutmut
    sys.path.append(_site)  # mutmut's own install, after the environment's packages (pytest, torch, ...)


class _SuitesOfTheCopy(importlib.abc.MetaPathFinder):
    """``harness.suites`` is the ``suites/`` folder of the current directory (the copy, or mutmut's ``mutants/``)."""

    def find_spec(self, name, path=None, target=None):
        if name != "harness.suites":
            return None
        init = Path.cwd() / "suites" / "__init__.py"
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])


sys.meta_path.insert(0, _SuitesOfTheCopy())


def _mutant_names() -> dict[str, list[str]]:
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.utils.file_utils import walk_mutatable_files

    names = {}
    for path in walk_mutatable_files():
        data = SourceFileMutationData(path=path)
        data.load()
        names[str(path)] = sorted(data.exit_code_by_key)
    return names


def _generate(jobs: int) -> None:
    from mutmut.__main__ import create_mutants
    from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths

    os.makedirs("mutants", exist_ok=True)
    copy_src_dir()
    copy_also_copy_files()
    setup_source_paths()
    create_mutants(jobs)


def _results(out: str) -> None:
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    rows = []
    for path, names in _mutant_names().items():
        from mutmut.mutation.data import SourceFileMutationData

        data = SourceFileMutationData(path=path)
        data.load()
        for name in names:
            rows.append({"file": path, "name": name, "exit_code": data.exit_code_by_key.get(name),
                         "diff": get_diff_for_mutant(name, path=path)})
    Path(out).write_text(json.dumps(rows, indent=1))


def main(command: str, *arguments: str) -> None:
    if command == "list":
        _generate(2)
        Path(arguments[0]).write_text(json.dumps(_mutant_names(), indent=1))
    elif command == "run":
        from mutmut.__main__ import cli

        cli(["run", "--max-children", arguments[0], *arguments[1:]])
    elif command == "results":
        _results(arguments[0])
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
