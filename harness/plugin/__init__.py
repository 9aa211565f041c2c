"""The harness's pytest plugin (the ``pytest11`` entry point): options, fixtures, the run report.

It acts only in a run that activates it (:mod:`harness.plugin.session`) and imports no torch before.
Safe to use: the fixtures and :func:`collect_suite`, for running a suite inside an engine's test tree."""

from __future__ import annotations

from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from harness import components, locations
from harness.plugin import implementations, options, session, warning_filters, xdist_order

if TYPE_CHECKING:
    import torch

    from harness.graphs import GraphBackend
    from harness.impls import Implementation

__all__ = ["MARKERS", "collect_suite"]

# The run report (and the orphaned-golden check) and the time limits that stop a hang are plugins of their own.
pytest_plugins = ["harness.plugin.report", "harness.plugin.timeouts"]


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)
    options.add_ini_settings(parser)


# Declared here rather than in a project's configuration, so that the suites run the same from a checkout and
# from an installed wheel (under --strict-markers too).
MARKERS = {
    "subprocess": "runs the case in a child process because it may crash the interpreter",
    "clause": "clause(ID): the contract clause of the component (harness/conformance/clauses.py) a test "
              "checks; python -m harness conformance reports per clause",
    **xdist_order.MARKERS,
}


_ANNOUNCED = pytest.StashKey[bool]()


# trylast: inside pytest's own wrapper, which records the warnings under the run's filters (its own go on top)
@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> Generator[None, None, None]:
    # pytest imports the conftest.py of each path argument before collection: a suite's, given by its path (a
    # reproduce line names an installed suite's file), imports the harness and torch's compiler. Filtered only where
    # every path argument lies in the suites, so that an engine's own conftest keeps its warnings.
    invoked = Path(early_config.invocation_params.dir)
    paths = [invoked / str(word).split("::")[0] for word in early_config.known_args_namespace.file_or_dir]
    given = [path for path in paths if path.exists()]
    if not given or not all(map(session.in_suites, given)):
        return (yield)
    with warning_filters.filtered():
        return (yield)


@pytest.hookimpl(tryfirst=True)  # before hypothesis's plugin loads the profile, so a bad name is one line
def pytest_configure(config: pytest.Config) -> None:
    for name, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")
    options.refuse_separate_path_values(config)  # before anything acts on the rootdir it may have moved
    if session.wanted_at_start(config):
        session.activate(config)
    elif config.getoption("hypothesis_profile", None):
        from harness.plugin.profiles import register_requested_profile

        register_requested_profile(config)


def pytest_collectstart(collector: pytest.Collector) -> None:
    # Before the collector imports anything: a suite's module reads the hypothesis profile when imported.
    if session.current_session(collector.config) is None and session.in_suites(collector.path):
        session.activate(collector.config)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, pytest.CollectReport,
                                                                         pytest.CollectReport]:
    # A suite's conftest and test modules import the harness, which imports torch and compiles at import.
    if session.current_session(collector.config) is None or not session.in_suites(collector.path):
        return (yield)
    with warning_filters.filtered():
        return (yield)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if session.current_session(config) is None and any(map(session.uses_harness_fixtures, items)):
        session.activate(config)
    if session.current_session(config) is not None:
        from harness.plugin.profiles import apply_reproduce_failure

        for item in items:
            if session.in_suites(item.path):
                warning_filters.mark(item)
        apply_reproduce_failure(config, items)
        # last: the order of what is left to run (a suite's long tests first, its rank-pool tests on one worker)
        xdist_order.order_for_workers(config, items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if session.current_session(item.config) is not None:
        from harness.plugin.failures import annotate_failure

        annotate_failure(item, report)  # the reproduce line, and how to update a golden
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    # A suite's test on CUDA runs with every side stream's work started late (harness.hazards.widened_races).
    current = session.current_session(item.config)
    if current is None or current.device.type != "cuda" or not session.in_suites(item.path):
        return (yield)
    from harness.hazards import widened_races

    with widened_races():
        return (yield)


def _header(config: pytest.Config) -> str | None:
    current = session.current_session(config)
    if current is None or config.stash.get(_ANNOUNCED, False):
        return None
    config.stash[_ANNOUNCED] = True
    import torch

    from harness.devices import experts_implementation
    from harness.plugin.profiles import current_hypothesis_profile

    return (
        f"harness: device={current.device}, graph backend={current.backend.name}, "
        f"impls={current.impl_specs or 'reference'}, "
        f"hypothesis profile={current_hypothesis_profile()}, "
        f"experts={experts_implementation()}, "
        f"torch {torch.__version__}"
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    return _header(config)


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    return _header(config)  # a run that collected the suites or fixtures without asking for the harness first


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> torch.device:
    return session.session_of(pytestconfig).device


@pytest.fixture(scope="session")
def graph_backend(pytestconfig: pytest.Config) -> GraphBackend:
    return session.session_of(pytestconfig).backend


@pytest.fixture(scope="session")
def implementation_under_test(pytestconfig: pytest.Config) -> Callable[[str], Implementation]:
    """``implementation_under_test(component)``: the selected :class:`harness.impls.Implementation`
    record (its ``name`` is the spec, for failure messages)."""
    return lambda component: implementations.selected_implementation(pytestconfig, component)


@pytest.fixture
def exact_comparison(graph_backend: GraphBackend, device: torch.device) -> Callable[[torch.dtype], bool]:
    """``exact_comparison(dtype)``: whether a replay is held bitwise to eager here
    (:func:`harness.compare.bitwise_expected`), else to the tolerance table."""
    from harness.compare import bitwise_expected

    return lambda dtype: bitwise_expected(backend=graph_backend.name, device=device, dtype=dtype)


@pytest.fixture
def failure_context(request: pytest.FixtureRequest) -> Callable[..., dict[str, Any]]:
    """Call with details (seed, shapes, ...) to get the context for a failure message."""
    from harness.plugin import failures

    return lambda **details: failures.failure_context(request, **details)


# One fixture per component of the table: graph_capturer, runner_factory, gather_function, ...
globals().update(implementations.implementation_fixtures())


def collect_suite(component: str) -> Callable[..., Any]:
    """A ``pytest_collect_file`` hook that collects the harness's suite of ``component`` (the installed
    one) in the folder of the ``conftest.py`` that assigns it, so an engine runs it inside its own tree::

        # tests/harness_gather/conftest.py
        from harness.plugin import collect_suite

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
