"""Inductor compiles in each of a run's processes itself (no pool of compile subprocesses per process),
unless the user said otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.devices import COMPILE_THREADS_VARIABLE, use_one_compile_worker


def test_an_environment_without_a_setting_gets_one_compile_worker():
    environment: dict[str, str] = {}
    use_one_compile_worker(environment)
    assert environment == {COMPILE_THREADS_VARIABLE: "1"}


def test_a_users_setting_is_kept():
    environment = {COMPILE_THREADS_VARIABLE: "6"}
    use_one_compile_worker(environment)
    assert environment == {COMPILE_THREADS_VARIABLE: "6"}


@pytest.mark.parametrize("user_setting", [None, "3"])
def test_a_process_that_already_read_inductors_config_gets_it_set_too(user_setting: str | None):
    # A child: Inductor reads the variable once, when its config is first imported.
    environment = {key: value for key, value in os.environ.items() if key != COMPILE_THREADS_VARIABLE}
    if user_setting:
        environment[COMPILE_THREADS_VARIABLE] = user_setting
    program = ("import os, torch._inductor.config as config\n"
               "from harness.devices import COMPILE_THREADS_VARIABLE, use_one_compile_worker\n"
               "before = config.compile_threads\n"
               "use_one_compile_worker(os.environ)\n"
               "print(before, config.compile_threads, os.environ[COMPILE_THREADS_VARIABLE])\n")
    completed = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=environment,
                               timeout=120)
    assert completed.returncode == 0, completed.stderr[-2000:]
    before, after, variable = completed.stdout.split()
    if user_setting is None:
        assert (after, variable) == ("1", "1")
    else:
        assert before == after == variable == user_setting
