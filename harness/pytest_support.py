"""Pytest glue: option handling, implementation selection, hypothesis profiles, reproduction lines.

The only module of the harness that imports pytest; the root ``conftest.py`` wires it in.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Any, Callable

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from harness import components, impls
from harness.devices import DEVICE_CHOICES, resolve_device
from harness.errors import HarnessError, UsageError
from harness.graphs import BACKEND_NAMES, GraphBackend, get_backend

__all__ = [
    "HarnessSession",
    "SESSION_KEY",
    "session_of",
    "add_options",
    "configure",
    "resolve_backend",
    "selected_implementation",
    "implementation_fixtures",
    "reproduce_command",
    "register_hypothesis_profiles",
]


@dataclasses.dataclass(frozen=True)
class HarnessSession:
    """What the options selected, validated once at start-up: kept in ``config.stash[SESSION_KEY]``."""

    device: torch.device
    backend: GraphBackend
    impl_specs: dict[str, str]  # component -> spec, only those given with --impl


SESSION_KEY = pytest.StashKey[HarnessSession]()


def session_of(config: pytest.Config) -> HarnessSession:
    return config.stash[SESSION_KEY]


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "LLM graph-optimisation harness")
    group.addoption("--device", choices=DEVICE_CHOICES, default="auto",
                    help="device for tensors and models (auto: cuda when present)")
    group.addoption("--graph-backend", choices=BACKEND_NAMES, default="auto",
                    help="graph backend (auto: cuda on a CUDA device, else emulated)")
    group.addoption("--impl", action="append", default=[], metavar="COMPONENT=SPEC",
                    help="implementation under test, e.g. gather=mypkg.kernels:gather or graphs=mutant:skip-break")


def register_hypothesis_profiles() -> None:
    common = dict(deadline=None, print_blob=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                         HealthCheck.data_too_large])
    settings.register_profile("dev", max_examples=10, **common)
    settings.register_profile("ci", max_examples=25, derandomize=True, database=None, **common)
    # The kill matrix needs only "some test fails", not a minimal example: shrinking a mutant's
    # first failure was most of each selfcheck run's time.
    settings.register_profile("selfcheck", max_examples=25, derandomize=True, database=None,
                              phases=[Phase.explicit, Phase.reuse, Phase.generate], **common)
    settings.register_profile(
        "nightly", max_examples=400,
        database=DirectoryBasedExampleDatabase(os.path.join(".hypothesis", "nightly")), **common,
    )
    # An explicit --hypothesis-profile wins; it is applied by hypothesis' own plugin after this.
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def _set_up_xdist_worker() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    # Workers sharing a few cores must not each start a full intra-op thread pool.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, workers)))
    if torch.cuda.is_available() and torch.cuda.device_count() > 1:
        torch.cuda.set_device(int(worker.removeprefix("gw")) % torch.cuda.device_count())


def resolve_backend(option: str, device: torch.device) -> GraphBackend:
    if option == "cuda" and device.type != "cuda":
        if torch.cuda.is_available():
            device = torch.device("cuda")
        else:
            raise UsageError(
                "--graph-backend cuda was requested but torch sees no CUDA device; use --graph-backend emulated"
            )
    if option == "auto":
        option = "cuda" if device.type == "cuda" else "emulated"
    return get_backend(option, device=device if device.type == "cuda" else None)


def configure(config: pytest.Config) -> None:
    """Validate options once, so a bad one is a usage error and not a failure in every test."""
    _set_up_xdist_worker()
    try:
        device = resolve_device(config.getoption("--device"))
        backend = resolve_backend(config.getoption("--graph-backend"), device)
        selected: dict[str, str] = {}
        for option in config.getoption("--impl"):
            component, spec = impls.parse_impl_option(option)
            selected[component] = spec
            impls.load(component, spec)  # fail now, with the reason, rather than in each test
    except HarnessError as error:
        raise pytest.UsageError(str(error)) from None
    config.stash[SESSION_KEY] = HarnessSession(device, backend, selected)


def selected_implementation(config: pytest.Config, component: str) -> impls.Implementation:
    """The implementation of ``component`` under test: the one ``--impl`` names, else the reference."""
    return impls.load(component, session_of(config).impl_specs.get(component, "reference"))


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
    conftest publishes them. Each yields what its suites call (a capturer, a factory, a function)."""
    return {row.fixture: _implementation_fixture(row) for row in components.COMPONENTS}


def reproduce_command(request: pytest.FixtureRequest) -> str:
    """The command line that reruns this test with the same device, backend and implementations."""
    session = session_of(request.config)
    parts = ["pytest", request.node.nodeid, "--device", session.device.type, "--graph-backend", session.backend.name]
    for component, spec in session.impl_specs.items():
        parts += ["--impl", f"{component}={spec}"]
    return shlex.join(parts)


def failure_context(request: pytest.FixtureRequest, /, **details: Any) -> dict[str, Any]:
    """Context for :func:`harness.compare.assert_equivalent` failure messages."""
    session = session_of(request.config)
    context: dict[str, Any] = {
        "implementations": dict(session.impl_specs) or "reference",
        "backend": session.backend.name,
    }
    context.update(details)
    context["reproduce"] = reproduce_command(request)
    return context
