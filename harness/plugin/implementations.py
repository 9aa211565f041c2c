"""The implementation under test of each component, and its one session fixture per component."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from harness import components, impls
from harness.plugin.session import session_of

__all__ = ["implementation_fixtures", "selected_implementation"]


def selected_implementation(config: pytest.Config, component: str) -> impls.Implementation:
    """The implementation of ``component`` under test: the one ``--impl`` names, else the reference."""
    session = session_of(config)
    return impls.load(component, session.impl_specs.get(component, "reference"), graph_backend=session.backend.name)


def _implementation_fixture(row: components.Component) -> Callable[..., Any]:
    def fixture(pytestconfig: pytest.Config) -> Any:
        implementation = selected_implementation(pytestconfig, row.name).obj
        return implementation(session_of(pytestconfig).backend) if row.binds_backend else implementation

    fixture.__doc__ = (f"The {row.name} implementation under test ({row.summary})"
                       + (", bound to the selected graph backend." if row.binds_backend else "."))
    fixture.__name__ = row.fixture
    return pytest.fixture(scope="session", name=row.fixture)(fixture)


def implementation_fixtures() -> dict[str, Callable[..., Any]]:
    """One session fixture per row of the component table, named by the row's ``fixture``; the root
    plugin publishes them. Each yields what its suites call (a capturer, a factory, a function)."""
    return {row.fixture: _implementation_fixture(row) for row in components.COMPONENTS}
