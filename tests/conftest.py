"""The harness's own tests: what a run of them needs beyond the harness's plugin and the root ``conftest.py``.

``@pytest.mark.long_running`` (the harness's marker, :mod:`harness.plugin.xdist_order`) marks a test that runs a
whole suite, a benchmark or a chain of child processes (tens of seconds here, more on a GPU runner): it
starts first, at the head of its own xdist worker's share (the GPU check's tests step had stopped at its
limit waiting for one started last).

``@pytest.mark.slow_child`` (this folder's own marker) marks an end-to-end test whose child processes run whole
suites (the packaged suite from an installed wheel, the docs' example commands): together two minutes of CPU
on 2 cores, a third of the rest of tests/. ``pytest tests/`` leaves
them out where no ``-m`` is given and they are not named by node id; ``.ci/run``, ``ci.yml`` and the GPU check
run them (``-m slow_child``, or every test with ``-m "slow_child or not slow_child"``).

Under pytest-xdist (``pytest tests/ -n auto``) the tests are dealt out with ``--dist worksteal`` unless the
command line names a ``--dist``: each worker starts with a contiguous share whose head holds the long tests
(with ``load``, the default of ``-n``, only the first quarter of the collection is dealt out at the start, so
the head of the second worker's share started minutes late), and an idle worker takes tests from a busy one.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from harness.plugin.xdist_order import order_for_workers

SLOW_CHILD = ("slow_child: an end-to-end test whose child processes run whole suites: left out of a run of tests/ "
              "without -m, run by .ci/run, ci.yml and the GPU check (-m slow_child)")


def _dist_given(config: pytest.Config) -> bool:
    words = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", "")),
             *config.getini("addopts")]
    return any(word in ("--dist", "-d") or word.startswith("--dist=") for word in words)


def _named(config: pytest.Config, item: pytest.Item) -> bool:
    """Whether the command line names ``item`` by its node id (``tests/test_wheel.py::test_...``)."""
    for argument in config.args:
        path, _, name = argument.partition("::")
        if name and Path(path).name == item.path.name and item.nodeid.split("::", 1)[1].startswith(name):
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which starts the workers with the chosen scheduler
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", SLOW_CHILD)
    # Byte code is written whatever PYTHONDONTWRITEBYTECODE says (a shell or an agent may set it): most tests start
    # child pytest processes, and without cached byte code each compiled the harness and rewrote its assertions
    # anew, about a third of a small child's CPU time (3.7 s against 2.4 s of user time, 2 cores). The caches
    # land in __pycache__ folders, which git ignores. The workers and children inherit this environment.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    if getattr(config.option, "dist", "no") == "load" and not _dist_given(config):
        config.option.dist = "worksteal"


@pytest.hookimpl(tryfirst=True)  # before the order is made: every worker must order the same items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.option.markexpr:  # an -m of the command line selects by itself, as does naming the test
        slow = [item for item in items
                if item.get_closest_marker("slow_child") is not None and not _named(config, item)]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item not in slow]
    # a run of tests/ that the harness's plugin did not activate for: its order all the same
    order_for_workers(config, items)


@pytest.fixture
def rewrite_module():
    """A function ``rewrite(path, text)`` that rewrites a test module a pytester run has already imported, so
    that the next run imports the new text: pytest before 9.2 reuses its assertion-rewritten byte code while a
    module's size and whole-second modification time are unchanged, and an edit of the same size within that
    second ('"segments": 3' to 4) ran the old test on a fast GPU runner. The modification time moves on 2 s."""
    def rewrite(path: Path, text: str) -> None:
        before = path.stat().st_mtime_ns
        path.write_text(text)
        later = max(path.stat().st_mtime_ns, before + 2_000_000_000)
        os.utime(path, ns=(later, later))

    return rewrite


_GOLDEN_PROJECT_CONFTEST = '''
import pytest
{head}
pytest_plugins = ["harness.plugin.report"]

@pytest.fixture
def snapshot(snapshot):
    from harness.golden import GoldenExtension
    return snapshot.use_extension(GoldenExtension)
'''


@pytest.fixture
def golden_project(pytester):
    """``golden_project(suite, conftest_head="", addopts="--device cpu")`` -> pytester: a project whose one suite
    module ``suites/demo/test_demo.py`` is ``suite``, with the ``snapshot`` fixture on the harness's golden
    extension (goldens in ``golden/demo``) and the run report, ``conftest_head`` run first in its conftest; every
    run of it is a harness run (a harness option in addopts)."""
    def make(suite: str, *, conftest_head: str = "", addopts: str = "--device cpu"):
        pytester.makeconftest(_GOLDEN_PROJECT_CONFTEST.format(head=conftest_head))
        pytester.mkdir("suites")
        pytester.mkdir("suites/demo")
        (pytester.path / "suites/demo/test_demo.py").write_text(suite)
        pytester.makeini(f"[pytest]\ntestpaths = suites\naddopts = {addopts}\n")
        return pytester

    return make


@pytest.fixture
def installed_suites() -> None:
    """Skips a test whose runs name the suites as an installed harness has them (``--pyargs harness.suites...``:
    ``pip install -e .`` or the wheel) where the harness runs uninstalled, from PYTHONPATH (the GPU check)."""
    import importlib.util

    if importlib.util.find_spec("harness.suites") is None:
        pytest.skip("the run names the suites as an installed harness has them (pip install -e . or the wheel); "
                    "this environment runs the harness uninstalled, from PYTHONPATH (the GPU check)")
