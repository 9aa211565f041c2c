""".ci/run runs the README's two commands, and every unit test runs in CI: the ``slow_child`` tests that a plain
``pytest tests/`` leaves out (tests/conftest.py) run in .ci/run and in both unit-test steps of ci.yml."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CI_RUN = (ROOT / ".ci" / "run").read_text()


def _commands(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _readme_commands() -> list[str]:
    first_block = re.search(r"^```bash\n(.*?)^```$", (ROOT / "README.md").read_text(), re.MULTILINE | re.DOTALL)[1]
    return _commands(first_block)


def test_the_readme_runs_the_unit_tests_on_xdist_workers_then_the_kill_matrix():
    main, second = _readme_commands()
    assert main.endswith("&& .venv/bin/pytest suites/")
    assert second.endswith("&& .venv/bin/pytest tests/ -n auto && .venv/bin/python -m harness selfcheck")


def test_ci_run_runs_both_readme_commands_and_checks_the_tree():
    main, second = _readme_commands()
    commands = _commands(CI_RUN)
    assert main in commands
    install = second.split(" && .venv/bin/pytest")[0]
    assert install == main.split(" && .venv/bin/pytest")[0]  # the same venv: .ci/run installs it once
    assert ".venv/bin/pytest tests/ -n auto" in commands
    assert ".venv/bin/python -m harness selfcheck --jobs 2" in commands
    assert commands.index(".venv/bin/pytest tests/ -n auto") > commands.index(main)
    assert 'tree_before=$(git status --porcelain --untracked-files=all)' in commands
    assert commands[-1].startswith('echo "[.ci/run] passed')


def test_the_slow_child_tests_run_in_ci():
    assert ".venv/bin/pytest tests/ -n auto -m slow_child" in _commands(CI_RUN)
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    unit_steps = re.findall(r"^\s*run: (\S*pytest tests/ .*)$", workflow, re.MULTILINE)
    assert len(unit_steps) == 2 and all('-m "slow_child or not slow_child"' in step for step in unit_steps), unit_steps
    # The GPU check runs every test (the slow_child ones too) but the CPU-only wheel file.
    gpu = (ROOT / ".ci" / "gpu" / "run").read_text()
    tests_step = re.search(r"command\[tests\]='(.*?)'$", gpu, re.DOTALL | re.MULTILINE)[1]
    assert tests_step.rstrip().endswith("--deselect tests/test_wheel.py")
    assert '-m "slow_child or not slow_child"' in tests_step
