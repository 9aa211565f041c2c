"""Root pytest configuration: options, device/backend/implementation selection, hypothesis profiles.

Options: ``--device {auto,cpu,cuda}``, ``--graph-backend {auto,cuda,emulated}``,
``--impl COMPONENT=SPEC`` (repeatable). Hypothesis profile: ``dev`` by default, ``ci`` when the
``CI`` variable is set, ``nightly`` on request (``--hypothesis-profile nightly``).
"""

from __future__ import annotations

import pytest
import torch

from harness import pytest_support
from harness.graphs import GraphBackend

pytest_support.register_hypothesis_profiles()


def pytest_addoption(parser: pytest.Parser) -> None:
    pytest_support.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    pytest_support.configure(config)


def pytest_report_header(config: pytest.Config) -> str:
    from hypothesis import settings

    return (
        f"harness: device={config.harness_device}, graph backend={config.harness_backend.name}, "
        f"impls={config.harness_impls or 'reference'}, hypothesis profile={settings._current_profile}, "
        f"torch {torch.__version__}"
    )


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> torch.device:
    return pytestconfig.harness_device


@pytest.fixture(scope="session")
def graph_backend(pytestconfig: pytest.Config) -> GraphBackend:
    return pytestconfig.harness_backend


@pytest.fixture
def failure_context(request: pytest.FixtureRequest):
    """Call with details (seed, shapes, ...) to get the context for a failure message."""
    return lambda **details: pytest_support.failure_context(request, **details)


@pytest.fixture(scope="session")
def graphs_impl(pytestconfig: pytest.Config):
    """The ``graphs`` implementation under test, already bound to the selected backend."""
    factory = pytest_support.selected_implementation(pytestconfig, "graphs").obj
    return factory(pytestconfig.harness_backend)


@pytest.fixture
def snapshot(snapshot):
    """Syrupy's snapshot, writing readable JSON goldens under golden/ (tensors compared within tolerance)."""
    from harness.golden import GoldenExtension

    return snapshot.use_extension(GoldenExtension)
