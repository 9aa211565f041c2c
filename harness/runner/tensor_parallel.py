"""Tensor-parallel runner cases: what each rank of a :class:`~harness.distributed.rank_pool.RankPool` runs.

:class:`TPSetup` and :class:`Composition` describe a case; the module-level step functions build and
shard the model, run the runner under test and return its outputs and the eager oracles for the test
process to compare (``docs/runner.md``, Tensor parallelism)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from harness import impls
from harness.batch import ForwardBatch, published_batch, select_bucket
from harness.compare import bitwise_expected
from harness.distributed.rank_pool import RankContext
from harness.errors import BucketError
from harness.graphs import eager_on_graph, get_backend
from harness.models import build_model, packed_causal_attention
from harness.models.tensor_parallel import shard_model
from harness.oracle import Checker
from harness.runner.cases import CONFIG, SEED, eager, eager_padded
from harness.runner.runner import map_tensors

__all__ = ["TP_BUCKETS", "TPSetup", "Composition", "BatchResult", "expected_rows", "expected_bucket",
           "run_compositions", "capture_plan", "raise_in_replay", "rank_model"]

# An odd bucket: its rows are no multiple of the group size, where a collective that splits rows
# between ranks needs padding of its own.
TP_BUCKETS = (3, 8)


@dataclasses.dataclass(frozen=True)
class TPSetup:
    """What every rank builds: zoo ``model`` (dense or moe) sharded with ``collectives`` ("graph":
    all-reduces inside captured segments, "break": each one an eager break), the runner and graph
    capturer named by their ``--impl`` specs, on ``graph_backend``, capturing ``buckets``."""

    model: str = "dense"
    collectives: str = "graph"
    runner_spec: str = "reference"
    graphs_spec: str = "reference"
    graph_backend: str = "emulated"
    buckets: tuple[int, ...] = TP_BUCKETS
    dtype: str = "float32"
    seed: int = SEED

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def describe(self) -> str:
        return (f"{self.model} ({self.dtype}) sharded with collectives in {self.collectives} mode, runner "
                f"{self.runner_spec}, graphs {self.graphs_spec}, {self.graph_backend} backend, buckets "
                f"{list(self.buckets)}")


@dataclasses.dataclass(frozen=True)
class Composition:
    """The same requests on every rank (``lengths``, token ids from ``seed``), and the trailing
    padding each rank's batch arrives with (``padding[rank]``; none where the tuple is short)."""

    lengths: tuple[int, ...]
    seed: int = 0
    hidden_mode: str = "none"
    all_logits: bool = False
    padding: tuple[int, ...] = ()

    def padding_of(self, rank: int) -> int:
        return self.padding[rank] if rank < len(self.padding) else 0

    def batch(self, rank: int, device: torch.device, *, arrived: bool = True) -> ForwardBatch:
        """Rank ``rank``'s batch: with the padding it arrives with, or (``arrived=False``) unpadded."""
        batch = ForwardBatch.from_lengths(self.lengths, vocab_size=CONFIG.vocab_size, seed=self.seed, device=device,
                                          hidden_mode=self.hidden_mode, all_logits=self.all_logits)
        padding = self.padding_of(rank) if arrived else 0
        return batch.padded_to(batch.num_tokens + padding) if padding else batch

    def describe(self) -> str:
        pads = f", arriving with padding {list(self.padding)} per rank" if any(self.padding) else ""
        return (f"requests of lengths {list(self.lengths)} (seed {self.seed}), hidden_mode={self.hidden_mode}, "
                f"all_logits={self.all_logits}{pads}")


def expected_rows(composition: Composition, world_size: int) -> int:
    """The rows every rank must run the composition at: the largest arrival."""
    return max(sum(composition.lengths) + composition.padding_of(rank) for rank in range(world_size))


def expected_bucket(composition: Composition, world_size: int, buckets: tuple[int, ...]) -> int | None:
    """The bucket every rank must replay in, or None where the group must run it eagerly."""
    try:
        return select_bucket(expected_rows(composition, world_size), buckets)
    except BucketError:
        return None


@dataclasses.dataclass
class BatchResult:
    """One rank's run of one composition: the runner's output and the oracles (CPU tensors), and
    what the runner's counters say it did. The call itself was checked on its rank against eager on the shard at
    the group's shapes (``eager_at_shapes``) by :class:`harness.oracle.Checker`, on everything a caller observes."""

    output: Any
    eager: Any
    eager_at_shapes: Any
    unsharded: Any
    replays_by_bucket: dict[int, int]
    eager_fallbacks: int
    restored: bool
    published: bool


def _to_cpu(value: Any) -> Any:
    return map_tensors(value, lambda tensor: tensor.detach().cpu())


def rank_model(context: RankContext, setup: TPSetup) -> tuple[torch.nn.Module, torch.nn.Module, Any]:
    """``(unsharded model, this rank's shard, runner under test)``, built once per group and setup."""
    key = ("tp-setup", setup)
    if key not in context.state:
        full = build_model(setup.model, seed=setup.seed, dtype=setup.torch_dtype, device=context.device)
        shard = shard_model(full, context.group, collectives=setup.collectives)
        # Before the runner captures: the graph's break calls this kernel at every replay.
        shard.stack.decoder_layers[0].self_attn.kernel = _attention_that_may_raise(context)
        backend = get_backend(setup.graph_backend, device=context.device if context.device.type == "cuda" else None)
        capturer = impls.load("graphs", setup.graphs_spec).obj(backend)
        factory = impls.load("runner", setup.runner_spec).obj
        # The construction must leave the shard as it was (harness.oracle).
        runner = _checker(context, setup).construct(lambda: factory(shard, buckets=setup.buckets, graphs=capturer),
                                                    modules=[shard])
        context.state[key] = full, shard, runner
    return context.state[key]


def _checker(context: RankContext, setup: TPSetup) -> Checker:
    """This rank's checker of ``setup``'s runner calls (it keeps each call's results for the next call's check)."""
    return context.state.setdefault(("tp-checker", setup), Checker(
        "runner", context=lambda **details: {"rank": f"{context.rank} of {context.world_size}",
                                             "setup": setup.describe(), **details}))


def warm_up_before_fork() -> None:
    """Compile the zoo MoE's combine in this process, before a pool forks its ranks from it: the
    compiled code is inherited, so ranks do not each compile it again (seconds of CPU each). The
    suites of this process compile it anyway."""
    model = build_model("moe", seed=SEED)
    eager(model, Composition((2,)).batch(0, torch.device("cpu")))


def _forward_restored(runner: Any) -> bool:
    layer = getattr(runner, "layer_model", None)
    return layer is None or "forward" not in vars(layer)


class _Kept:
    """A zero-argument call that keeps its result (the checker's eager twin, whose result the test compares too)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn, self.result = fn, None

    def __call__(self) -> Any:
        self.result = self.fn()
        return self.result


def run_compositions(context: RankContext, setup: TPSetup, compositions: list[Composition],
                     mode: str | None = None) -> list[BatchResult]:
    """Step: run each composition through the runner under test (``run``) under the caller's autograd ``mode``
    (:data:`harness.oracle.CALLING_MODES`), checked against eager on the shard at the group's shapes (every rank
    runs the checker's eager twin, whose collectives meet, then the runner), then the other oracles."""
    full, shard, runner = rank_model(context, setup)
    exact = bitwise_expected(backend=setup.graph_backend, device=context.device, dtype=setup.torch_dtype)
    results = []
    for composition in compositions:
        batch = composition.batch(context.rank, context.device)
        unpadded = composition.batch(context.rank, context.device, arrived=False)
        before = dict(runner.stats.replays_by_bucket), runner.stats.eager_fallbacks
        bucket = expected_bucket(composition, context.world_size, setup.buckets)
        rows = bucket if bucket is not None else expected_rows(composition, context.world_size)
        eager_at_shapes = _Kept(functools.partial(eager_padded, shard, unpadded, rows))
        output = _checker(context, setup).call(
            functools.partial(runner.run, batch), eager_at_shapes, inputs=batch, modules=[shard], exact=exact,
            mode=mode, batch=composition.describe(), comparison="against eager on the shard at the group's shapes")
        replays = {bucket: count - before[0].get(bucket, 0) for bucket, count in runner.stats.replays_by_bucket.items()
                   if count != before[0].get(bucket, 0)}
        fallbacks = runner.stats.eager_fallbacks - before[1]
        restored, published = _forward_restored(runner), published_batch() is not None
        results.append(BatchResult(
            output=_to_cpu(output), eager=_to_cpu(eager(shard, unpadded)),
            eager_at_shapes=_to_cpu(eager_at_shapes.result), unsharded=_to_cpu(eager(full, unpadded)),
            replays_by_bucket=replays, eager_fallbacks=fallbacks, restored=restored, published=published))
    return results


def capture_plan(context: RankContext, setup: TPSetup) -> dict[str, Any]:
    """Step: the runner's capture plan on this rank (segments and breaks per bucket)."""
    return rank_model(context, setup)[2].capture_plan()


class InjectedError(RuntimeError):
    """The error a test injects into a replay."""


def _attention_that_may_raise(context: RankContext) -> Callable[..., Any]:
    @eager_on_graph
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if context.state.pop("raise_in_attention", False):
            raise InjectedError(f"injected on rank {context.rank}: the first attention break raised")
        return packed_causal_attention.__wrapped__(q, k, v)

    return attention


def raise_in_replay(context: RankContext, setup: TPSetup, composition: Composition, ranks: tuple[int, ...]
                    ) -> dict[str, Any]:
    """Step: on ``ranks``, the first layer's attention break raises during the replay of ``composition``.

    Every rank checks that its runner restored the layer stack's forward and unpublished the batch
    after the error. Where every rank raised (no rank is left inside a collective), the step then
    runs ``composition`` again and returns the checks and that :class:`BatchResult`. Otherwise each
    rank whose run raised re-raises with its checks in the message: the pool reports it and tears
    its group down, which releases the peers blocked in a collective, whose runs raise in turn.
    """
    runner = rank_model(context, setup)[2]
    context.state["raise_in_attention"] = context.rank in ranks
    batch = composition.batch(context.rank, context.device)
    try:
        runner.run(batch)
    except BaseException as error:  # noqa: BLE001 - reported below, with what the runner left behind
        restored, published = _forward_restored(runner), published_batch() is not None
        if set(ranks) != set(range(context.world_size)):
            raise RuntimeError(
                f"rank {context.rank}: run() raised {type(error).__name__}: {str(error).splitlines()[0][:200]}; "
                f"after it the layer stack's forward was {'restored' if restored else 'STILL PATCHED'} and the "
                f"batch {'still published' if published else 'unpublished'}") from error
    else:
        raise AssertionError(f"rank {context.rank}: the injected error never surfaced from run() (ranks {ranks} "
                             "raise in the first attention break)")
    finally:
        context.state.pop("raise_in_attention", None)
    return {"restored": restored, "published": published,
            "after": run_compositions(context, setup, [composition])[0]}
