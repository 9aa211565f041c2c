"""Fixtures of the architecture suites: the transformers zoo, built once per session, and
runners of the implementation under test over it (through the engine-style adapter)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from harness.models.transformers_adapter import TransformersAdapter
from harness.models.transformers_zoo import architecture, build_architecture
from harness.oracle import Checker, context_key
from harness.plugin.failures import failure_context
from harness.runner.matrices import discovery_matrix

SEED = 7
BUCKETS = (8, 16)


@pytest.fixture(scope="session")
def zoo_discovery_matrix() -> dict[str, Any]:
    """The discovery matrix of the whole zoo, computed once (builds every architecture)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return discovery_matrix(seed=SEED)


@pytest.fixture(scope="session")
def architecture_buckets() -> tuple[int, ...]:
    """The token-count buckets the architecture runners capture."""
    return BUCKETS


@pytest.fixture(scope="session")
def architecture_runner(runner_factory: Any, graph_capturer: Any, device: torch.device,
                        request: pytest.FixtureRequest) -> Callable[..., tuple[Any, Any]]:
    """``architecture_runner(name, requires_grad=False)`` -> ``(adapter, runner)``, captured once per
    session with the ``runner`` and ``graphs`` implementations under test; the construction must leave the
    model as it was (:meth:`harness.oracle.Checker.construct`)."""
    factory, capturer = runner_factory, graph_capturer
    checker = Checker("runner", context=lambda **details: failure_context(request, **details))
    cache: dict[tuple[str, bool, str], tuple[Any, Any]] = {}

    def get(name: str, *, requires_grad: bool = False) -> tuple[Any, Any]:
        key = (name, requires_grad, context_key("runner"))  # one runner per caller's context (context_key)
        if key not in cache:
            model = build_architecture(name, seed=SEED, device=device)
            model.requires_grad_(requires_grad)
            adapter = TransformersAdapter(model, layout=architecture(name).layout)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cache[key] = adapter, checker.construct(
                    lambda: factory(adapter, buckets=BUCKETS, graphs=capturer), modules=[adapter], model=name)
        return cache[key]

    return get
