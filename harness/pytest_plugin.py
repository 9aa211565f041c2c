"""The harness's pytest plugin: options, device/backend/implementation selection, hypothesis profiles,
fixtures and the run report.

Installed as the ``pytest11`` entry point ``harness.pytest_plugin``, so every pytest of an environment
where the harness is installed has it; a checkout's ``pyproject.toml`` also names it (``-p``, the same
name: it is loaded once), for runs with plugin autoloading switched off.
Everywhere it declares its options and markers; everything else acts only in a run it is activated in
(a harness option given, or the harness's suites or fixtures collected: :mod:`harness.pytest_support`),
so an engine's own unrelated test runs are left exactly as they were.

Options: ``--device {auto,cpu,cuda}``, ``--graph-backend {auto,cuda,emulated}``,
``--impl COMPONENT=SPEC`` (repeatable), ``--reproduce-failure``, ``--harness-report PATH``.
Hypothesis profile: ``dev`` by default, ``ci`` when the ``CI`` variable is set, ``nightly`` and
``selfcheck`` on request (``--hypothesis-profile``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from harness import _xdist_order, components, locations, pytest_support
from harness.compare import bitwise_expected
from harness.graphs import GraphBackend
from harness.models.transformers_zoo import experts_implementation

# The run report (and the orphaned-golden check) and the time limits that stop a hang are plugins of their own.
pytest_plugins = ["harness.report", "harness.timeout_plugin"]


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    pytest_support.add_options(parser, pluginmanager)


# The suites' markers, declared here rather than in a project's configuration, so that the suites run the
# same from a checkout and from an installed wheel (under --strict-markers too).
MARKERS = {
    "subprocess": "runs the case in a child process because it may crash the interpreter",
    "clause": "clause(ID): the contract clause of the component (harness/clauses.py) a test checks; "
              "python -m harness conformance reports per clause",
    **_xdist_order.MARKERS,
}


_ANNOUNCED = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)  # before hypothesis's plugin loads the profile, so a bad name is one line
def pytest_configure(config: pytest.Config) -> None:
    for name, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")
    if pytest_support.wanted_at_start(config):
        pytest_support.activate(config)
    else:
        pytest_support.register_requested_profile(config)


def pytest_collectstart(collector: pytest.Collector) -> None:
    # Before the collector imports anything: a suite's module reads the hypothesis profile when imported.
    if pytest_support.current_session(collector.config) is None and pytest_support.in_suites(collector.path):
        pytest_support.activate(collector.config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if pytest_support.current_session(config) is None and any(map(pytest_support.uses_harness_fixtures, items)):
        pytest_support.activate(config)
    if pytest_support.current_session(config) is not None:
        pytest_support.apply_reproduce_failure(config, items)
        # last: the order of what is left to run (a suite's long tests first, its rank-pool tests on one worker)
        _xdist_order.order_for_workers(config, items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    pytest_support.annotate_failure(item, report)  # the reproduce line, and how to update a golden
    return report


def _header(config: pytest.Config) -> str | None:
    session = pytest_support.current_session(config)
    if session is None or config.stash.get(_ANNOUNCED, False):
        return None
    config.stash[_ANNOUNCED] = True
    return (
        f"harness: device={session.device}, graph backend={session.backend.name}, "
        f"impls={session.impl_specs or 'reference'}, "
        f"hypothesis profile={pytest_support.current_hypothesis_profile()}, "
        f"experts={experts_implementation()}, "
        f"torch {torch.__version__}"
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    return _header(config)


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    return _header(config)  # a run that collected the suites or fixtures without asking for the harness first


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> torch.device:
    return pytest_support.session_of(pytestconfig).device


@pytest.fixture(scope="session")
def graph_backend(pytestconfig: pytest.Config) -> GraphBackend:
    return pytest_support.session_of(pytestconfig).backend


@pytest.fixture(scope="session")
def implementation_under_test(pytestconfig: pytest.Config):
    """``implementation_under_test(component)``: the selected :class:`harness.impls.Implementation`
    record (its ``name`` is the spec, for failure messages)."""
    return lambda component: pytest_support.selected_implementation(pytestconfig, component)


@pytest.fixture
def exact_comparison(graph_backend: GraphBackend, device: torch.device):
    """``exact_comparison(dtype)``: whether a replay is held bitwise to eager here
    (:func:`harness.compare.bitwise_expected`), else to the tolerance table."""
    return lambda dtype: bitwise_expected(backend=graph_backend.name, device=device, dtype=dtype)


@pytest.fixture
def failure_context(request: pytest.FixtureRequest):
    """Call with details (seed, shapes, ...) to get the context for a failure message."""
    return lambda **details: pytest_support.failure_context(request, **details)


# One fixture per component of the table: graph_capturer, runner_factory, gather_function, ...
globals().update(pytest_support.implementation_fixtures())


def collect_suite(component: str) -> Callable[..., Any]:
    """A ``pytest_collect_file`` hook that collects the harness's suite of ``component`` (the installed
    one) in the folder of the ``conftest.py`` that assigns it, so an engine runs it inside its own tree::

        # tests/harness_gather/conftest.py
        from harness.pytest_plugin import collect_suite

        pytest_collect_file = collect_suite("gather")

    ``pytest tests/ --impl gather=my_engine.ops:gather`` then runs it with the engine's other tests.
    """
    suite = locations.project_root() / components.get_component(component).suite

    def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
        # The conftest.py itself, seen by the hook when its folder is collected: it stands for the suite.
        if file_path.name == "conftest.py" and file_path.parent == getattr(parent, "path", None):
            return pytest.Package.from_parent(parent, path=suite)
        return None

    return pytest_collect_file
