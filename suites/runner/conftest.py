"""Fixtures of the runner suites: the implementation under test, runners over the model zoo, and the one way
a test calls a runner (:func:`check_run`, through :mod:`harness.oracle`). Any runner given by ``--impl
runner=module:attr`` runs these suites."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest
import torch

from harness.compare import assert_equivalent
from harness.conformance.plugin import PerTestInConformance
from harness.models import build_model
from harness.oracle import Checker, context_key
from harness.plugin.failures import failure_context as context_of
from harness.runner import ForwardBatch, select_bucket
from harness.runner.cases import BUCKETS, SEED, eager, eager_padded
from harness.runner.runner import map_tensors


@pytest.fixture(scope="session")
def build_runner(runner_factory: Callable[..., Any], graph_capturer: Any,
                 request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``build_runner(model, buckets=..., strict_discovery=...)``: a fresh runner under test, built through
    :meth:`harness.oracle.Checker.construct`: its construction must leave the model and the process as they
    were (no parameter, buffer, hook, flag or ``forward`` changed; random state restored for the caller)."""

    def build(model: torch.nn.Module, *, buckets: Iterable[int] = BUCKETS, strict_discovery: bool = False) -> Any:
        __tracebackhide__ = True
        checker = Checker("runner", context=lambda **details: context_of(request, **details))
        # Described without iterating them: buckets given as a one-shot iterable must reach the runner whole.
        described = list(buckets) if isinstance(buckets, (tuple, list)) else repr(buckets)
        return checker.construct(
            lambda: runner_factory(model, buckets=buckets, graphs=graph_capturer, strict_discovery=strict_discovery),
            modules=[model], model=type(model).__name__, buckets=described)

    return build


@pytest.fixture(scope="session")
def zoo_runner(build_runner: Callable[..., Any], device: torch.device) -> Callable[..., tuple[Any, Any]]:
    """``zoo_runner(name, dtype)`` -> ``(model, runner)``, captured once per session (once per test in a
    conformance run: ``harness.conformance.plugin.PerTestInConformance``).

    Tests that patch the model or runner undo it (monkeypatch) and must leave the runner usable,
    which is itself part of the contract. Discovery warnings are checked on fresh runners instead.
    """
    cache = PerTestInConformance()

    def get(name: str, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
        # Inside a hypothesis example, the caller's context the example holds from here to its end: a runner is
        # built in it and serves only in it (a runner replays in its construction's context), one per context.
        def build() -> tuple[Any, Any]:
            model = build_model(name, seed=SEED, dtype=dtype, device=device)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return model, build_runner(model)

        return cache.get((name, dtype, context_key("runner")), build)

    return get


@pytest.fixture
def runner_checker(failure_context: Callable[..., dict]) -> Checker:
    """This test's one :class:`harness.oracle.Checker`: it keeps each call's results to check that the next
    call, whichever runner it goes to, leaves them alone."""
    return Checker("runner", context=failure_context)


@pytest.fixture
def check_run(runner_checker: Checker, exact_comparison: Callable[[torch.dtype], bool],
              failure_context: Callable[..., dict]) -> Callable[..., Any]:
    """``check_run(runner, model, batch, via="run", mode=None, dtype=..., buckets=BUCKETS, replayed=None,
    twin=None, modules=None, checker=None, **details)``: call ``runner.run(batch)`` (or ``via="replay"``) under the
    caller's autograd ``mode`` (:data:`harness.oracle.CALLING_MODES`) and return its result, checked (``via``
    may also be a function of the batch that calls the runner, for a test that counts what a call does).

    Two oracles, both eager runs of the same model, in one call:

    * :class:`harness.oracle.Checker` runs eager on the same batch (:func:`harness.runner.cases.eager`) and then
      the runner, and compares everything a caller can observe: values (within the tolerance table; bitwise
      for a batch run eagerly where :func:`harness.compare.bitwise_expected`), each output's strides,
      ``requires_grad``, ``is_inference``, ``grad_fn`` and aliasing, the process and ``model`` state left
      behind (modes, gc, hooks, parameters, the layer's ``forward``), writes into the batch, the random
      state, and whether the previous call's results survived this one;
    * where :func:`harness.compare.bitwise_expected`, a replay must also equal eager bitwise at the replay's
      shapes (the batch padded to the smallest of ``buckets`` holding its rows).

    ``checker``: another :class:`harness.oracle.Checker` than the test's one (``runner_checker``), for calls made
    from another thread: each thread's calls then keep and check their own results, in their own order.
    ``replayed`` (default: whether a bucket holds the batch's rows) says whether the runner should replay or
    run eagerly; ``"either"`` where the contract lets it choose (then values are held to the tolerance table).
    A model with state of its own (a KV cache) runs its eager twin on a copy: ``twin(batch)`` is then the oracle
    (at the replay's shapes where bitwise, as :func:`harness.runner.cases.eager_forward` runs it) and
    ``modules`` the runner's modules that eager leaves alone. ``writes_batch``: the model's layer stack writes its
    arguments in place, so eager runs on a copy of the batch (and the bitwise check on another), and the batch must
    end as eager's copy ends. Failures name the implementation, the batch, the mode, ``details``, the element and a
    reproduce command.
    """

    def call(runner: Any, model: torch.nn.Module, batch: ForwardBatch, /, *, via: str | Callable[..., Any] = "run",
             mode: str | None = None, dtype: torch.dtype = torch.float32, buckets: tuple[int, ...] = BUCKETS,
             replayed: bool | str | None = None, twin: Callable[[ForwardBatch], Any] | None = None,
             modules: Sequence[torch.nn.Module] | None = None, checker: Checker | None = None,
             writes_batch: bool = False, **details: Any) -> Any:
        __tracebackhide__ = True
        bitwise = exact_comparison(dtype)
        rows = batch.num_tokens + batch.num_padding
        either = replayed == "either"
        replayed = rows <= max(buckets) if replayed is None else replayed
        bucket = select_bucket(rows, buckets) if replayed and not either else None
        given_twin = twin is not None
        if twin is None:  # a batch arriving padded: eager on it as it arrived, per-token outputs cut to its real tokens
            twin = (lambda b: eager(model, b)) if not batch.num_padding else (lambda b: eager_padded(model, b, rows))
        call_runner = via if callable(via) else getattr(runner, via)
        shown = {"dtype": str(dtype), "batch": batch.describe(), "via": getattr(via, "__name__", via), **details}
        # Copies made before any call writes the batch: eager's twin of it, and the bitwise check's.
        eager_batch = map_tensors(batch, torch.Tensor.clone) if writes_batch else None
        pristine = map_tensors(batch, torch.Tensor.clone) if writes_batch else batch
        oracle = twin
        actual = (checker or runner_checker).call(
            lambda: call_runner(batch), lambda: oracle(batch if eager_batch is None else eager_batch), inputs=batch,
            eager_inputs=eager_batch,
            modules=[model] if modules is None else modules,
            exact=bitwise and not either and (given_twin or bucket is None),
            mode=mode, **shown,
            comparison="against the eager twin" if given_twin else "against eager on the same batch")
        if bitwise and bucket is not None and not given_twin:
            assert_equivalent(actual, eager_padded(model, pristine, bucket), exact=True, context=failure_context(
                **shown, **({"mode": mode} if mode else {}),
                comparison=f"bitwise against eager on the batch padded to bucket {bucket}"))
        return actual

    return call
