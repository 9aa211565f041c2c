"""`.ci/gpu/run` is the one GPU check and `.github/workflows/gpu.yml` calls its steps by name: the two
cannot drift apart (every step of the script runs in the workflow, and the workflow runs nothing else)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "gpu" / "run"
WORKFLOW = ROOT / ".github" / "workflows" / "gpu.yml"


def _script_steps() -> list[str]:
    return re.findall(r"^command\[(\w+)\]=", SCRIPT.read_text(), re.MULTILINE)


def test_the_workflow_runs_every_step_of_the_script_and_nothing_else():
    workflow = WORKFLOW.read_text()
    called = re.findall(r"\.ci/gpu/run [^\n]*--step (\w+)", workflow)
    assert sorted(called) == sorted(_script_steps()), (
        f"gpu.yml calls steps {sorted(called)}, .ci/gpu/run defines {sorted(_script_steps())}")
    # No check of its own beside the script's: pytest and the harness's checks run only through it.
    assert not re.search(r"bin/pytest|-m pytest|harness selfcheck|harness bench", workflow), (
        "gpu.yml runs a check of its own; make it a step of .ci/gpu/run")


def test_every_step_has_a_limit_and_the_limits_fit_one_device_call():
    text = SCRIPT.read_text()
    limits = {name: int(seconds) for name, seconds in re.findall(r"^limit\[(\w+)\]=(\d+)", text, re.MULTILINE)}
    assert set(limits) == set(_script_steps())
    default = re.search(r"\|\| steps=\(([\w ]+)\)", text)[1].split()  # opt-in steps (sglang) run on their own
    # The whole check in one 10-minute call of a GPU machine, with half a minute for installing the wheels
    # and printing the table.
    assert sum(limits[step] for step in default) <= 9 * 60 + 30, (
        f"step limits {limits} of the default steps {default} exceed 9.5 minutes (one device call with set-up)")
    assert all(limit <= 590 for limit in limits.values()), "a step must fit one 10-minute device call with set-up"


def test_the_script_parses_and_refuses_an_unknown_argument():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    completed = subprocess.run([str(SCRIPT), "--bogus"], capture_output=True, text=True)
    assert completed.returncode == 2 and "unknown argument '--bogus'" in completed.stderr
