"""Root pytest configuration: options, device/backend/implementation selection, hypothesis profiles.

Options: ``--device {auto,cpu,cuda}``, ``--graph-backend {auto,cuda,emulated}``,
``--impl COMPONENT=SPEC`` (repeatable). Hypothesis profile: ``dev`` by default, ``ci`` when the
``CI`` variable is set, ``nightly`` on request (``--hypothesis-profile nightly``).
"""

from __future__ import annotations

import pytest
import torch

from harness import pytest_support
from harness.compare import bitwise_expected
from harness.graphs import GraphBackend
from harness.models.transformers_zoo import experts_implementation

pytest_support.register_hypothesis_profiles()

# The run report (and the orphaned-golden check) and the time limits that stop a hang are plugins of their own.
pytest_plugins = ["harness.report", "harness.timeout_plugin"]


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    pytest_support.add_options(parser, pluginmanager)


@pytest.hookimpl(tryfirst=True)  # before hypothesis's plugin loads the profile, so a bad name is one line
def pytest_configure(config: pytest.Config) -> None:
    pytest_support.configure(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    pytest_support.apply_reproduce_failure(config, items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    pytest_support.annotate_failure(item, report)  # the reproduce line, and how to update a golden
    return report


def pytest_report_header(config: pytest.Config) -> str:
    session = pytest_support.session_of(config)
    return (
        f"harness: device={session.device}, graph backend={session.backend.name}, "
        f"impls={session.impl_specs or 'reference'}, "
        f"hypothesis profile={pytest_support.current_hypothesis_profile()}, "
        f"experts={experts_implementation()}, "
        f"torch {torch.__version__}"
    )


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


@pytest.fixture
def snapshot(snapshot):
    """Syrupy's snapshot, writing readable JSON goldens under golden/ (tensors compared within tolerance)."""
    from harness.golden import GoldenExtension

    return snapshot.use_extension(GoldenExtension)
