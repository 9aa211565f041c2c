"""The harness's own tests: what a run of them needs beyond the harness's plugin and the root ``conftest.py``.

``@pytest.mark.long_running`` (the harness's marker, :mod:`harness.plugin.xdist_order`) marks a test that runs a
whole suite, a benchmark or a chain of child processes (tens of seconds here, more on a GPU runner): it
starts first, at the head of its own xdist worker's share (the GPU check's tests step had stopped at its
limit waiting for one started last). The longest of them, the wheel's, heads the first share.

Under pytest-xdist (``pytest tests/ -n auto``) the tests are dealt out with ``--dist worksteal`` unless the
command line names a ``--dist``: each worker starts with a contiguous share whose head holds the long tests
(with ``load``, the default of ``-n``, only the first quarter of the collection is dealt out at the start, so
the head of the second worker's share started minutes late), and an idle worker takes tests from a busy one.
"""

from __future__ import annotations

import os
import shlex

import pytest

from harness.plugin.xdist_order import order_for_workers

# The longest test of tests/ (it builds the wheel and runs suites from a virtual environment): first of all.
FIRST = "tests/test_wheel.py::test_an_engine_ci_runs_the_installed_wheel"


def _dist_given(config: pytest.Config) -> bool:
    words = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", "")),
             *config.getini("addopts")]
    return any(word in ("--dist", "-d") or word.startswith("--dist=") for word in words)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which starts the workers with the chosen scheduler
def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "dist", "no") == "load" and not _dist_given(config):
        config.option.dist = "worksteal"


@pytest.hookimpl(tryfirst=True)  # before the harness plugin's hook, which would order them first
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.nodeid != FIRST)  # stable: the rest keep their order
    # a run of tests/ that the harness's plugin did not activate for: its order all the same
    order_for_workers(config, items)
