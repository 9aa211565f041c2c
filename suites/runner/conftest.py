"""Fixtures of the runner suites: the implementation under test, runners over the model zoo, the
eager-equivalence assertion. Any runner given by ``--impl runner=module:attr`` runs these suites."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from harness.compare import assert_equivalent
from harness.models import build_model
from harness.runner import ForwardBatch, select_bucket
from harness.runner.cases import BUCKETS, SEED, eager, eager_padded


@pytest.fixture(scope="session")
def build_runner(runner_factory: Callable[..., Any], graph_capturer: Any) -> Callable[..., Any]:
    """``build_runner(model, buckets=..., strict_discovery=...)``: a fresh runner under test."""

    def build(model: torch.nn.Module, *, buckets: tuple[int, ...] = BUCKETS, strict_discovery: bool = False) -> Any:
        return runner_factory(model, buckets=buckets, graphs=graph_capturer, strict_discovery=strict_discovery)

    return build


@pytest.fixture(scope="session")
def zoo_runner(build_runner: Callable[..., Any], device: torch.device) -> Callable[..., tuple[Any, Any]]:
    """``zoo_runner(name, dtype)`` -> ``(model, runner)``, captured once per session.

    Tests that patch the model or runner undo it (monkeypatch) and must leave the runner usable,
    which is itself part of the contract. Discovery warnings are checked on fresh runners instead.
    """
    cache: dict[tuple[str, torch.dtype], tuple[Any, Any]] = {}

    def get(name: str, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
        if (name, dtype) not in cache:
            model = build_model(name, seed=SEED, dtype=dtype, device=device)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cache[name, dtype] = model, build_runner(model)
        return cache[name, dtype]

    return get


@pytest.fixture
def assert_matches_eager(exact_comparison: Callable[[torch.dtype], bool],
                         failure_context: Callable[..., dict]) -> Callable[..., None]:
    """``assert_matches_eager(actual, model, batch, dtype=..., name=..., seed=..., replayed=True)``.

    Two oracles, both eager runs of the same model: on the same batch, within the tolerance table
    (the semantic check), and, where :func:`harness.compare.bitwise_expected`, bitwise against eager
    at the replay's shapes (the batch padded to its smallest bucket of :data:`BUCKETS`). A batch
    the runner should run eagerly (``replayed=False``) must be bitwise eager itself there.
    Failures name the implementation, model, seed, request lengths, dtype, the element and a
    reproduce command.
    """

    def check(actual: Any, model: torch.nn.Module, batch: ForwardBatch, *, dtype: torch.dtype, name: str,
              seed: int, replayed: bool = True, **details: Any) -> None:
        __tracebackhide__ = True
        bitwise = exact_comparison(dtype)
        bucket = select_bucket(batch.num_tokens, BUCKETS) if replayed else None

        def context(comparison: str) -> dict:
            return failure_context(model=name, seed=seed, dtype=str(dtype), batch=batch.describe(),
                                   comparison=comparison, **details)

        expected = eager(model, batch)
        assert_equivalent(actual, expected, exact=bitwise and bucket is None,
                          context=context("against eager on the same batch"))
        if bitwise and bucket is not None:
            assert_equivalent(actual, eager_padded(model, batch, bucket), exact=True,
                              context=context(f"bitwise against eager on the batch padded to bucket {bucket}"))

    return check
