"""Fixtures of the tensor-parallel runner suite: one pool of rank processes for the session
(``--tp`` ranks; gloo on the CPU, NCCL on GPUs), and the check of each rank's results."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from harness.compare import assert_equivalent, bitwise_expected
from harness.plugin.tensor_parallel import TensorParallelSession, tensor_parallel_session
from harness.runner.tensor_parallel import BatchResult, Composition, TPSetup, expected_bucket


@pytest.fixture(scope="session")
def tp(pytestconfig: pytest.Config) -> TensorParallelSession:
    session = tensor_parallel_session(pytestconfig)
    yield session
    session.pool.close()


@pytest.fixture
def assert_ranks_match_eager(failure_context: Callable[..., dict]) -> Callable[..., None]:
    """``check(setup, composition, results)``: ``results`` holds every rank's :class:`BatchResult`.

    On every rank: the group picked the bucket :func:`expected_bucket` names (or ran eagerly on
    every rank where none holds the largest arrival), the forward was restored and the batch
    unpublished; the output equals eager at the shapes the group ran at (bitwise where
    :func:`harness.compare.bitwise_expected`; each rank's call was also checked there, on everything a caller
    observes, by :class:`harness.oracle.Checker`), eager on the unpadded batch and the unsharded model
    within the tolerance table; and all ranks' outputs are bitwise equal (an all-reduce and an
    all-gather hand every rank the same values).
    """

    def check(setup: TPSetup, composition: Composition, results: list[BatchResult]) -> None:
        __tracebackhide__ = True
        world = len(results)
        bucket = expected_bucket(composition, world, setup.buckets)
        # The ranks' backend, which is the session's except where too few GPUs made them gloo CPU ranks.
        exact = bitwise_expected(backend=setup.graph_backend, device="cpu", dtype=setup.torch_dtype)
        replays = [result.replays_by_bucket for result in results]
        fallbacks = [result.eager_fallbacks for result in results]
        wanted = ({bucket: 1}, 0) if bucket is not None else ({}, 1)
        assert all((r, f) == wanted for r, f in zip(replays, fallbacks)), (
            f"{composition.describe()}: every rank must "
            + (f"replay bucket {bucket} once" if bucket is not None else "run it eagerly (no bucket holds the "
               "largest arrival)")
            + f"; replays by bucket per rank {replays}, eager fallbacks per rank {fallbacks} ({setup.describe()}). "
            "The ranks must agree on one bucket, chosen from the largest arrival of any rank (an all-reduce "
            "of the token counts); an engine without tensor parallelism runs the suites with --tp 1, which "
            "leaves these cases out")
        for rank, result in enumerate(results):
            assert result.restored and not result.published, (
                f"rank {rank}: after run() the layer stack's forward is "
                f"{'restored' if result.restored else 'still patched'} and the batch "
                f"{'still published' if result.published else 'unpublished'}; {composition.describe()}")

            def context(comparison: str, rank: int = rank) -> dict:
                return failure_context(rank=f"{rank} of {world}", setup=setup.describe(),
                                       batch=composition.describe(), comparison=comparison)

            shapes = f"bucket {bucket}" if bucket is not None else "the group's rows, eagerly"
            assert_equivalent(result.output, result.eager_at_shapes, exact=exact,
                              context=context(f"against eager on the shard at the group's shapes ({shapes})"))
            assert_equivalent(result.output, result.eager, exact=False,
                              context=context("against eager on the shard, unpadded batch"))
            assert_equivalent(result.output, result.unsharded, exact=False,
                              context=context("against the unsharded model (TP=1), unpadded batch"))
            assert_equivalent(result.output, results[0].output, exact=True,
                              context=context("against rank 0's output (ranks must agree bitwise)"))

    return check
