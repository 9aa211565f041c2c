"""Pad rows' metadata: a replay hands attention the padding fill in every pad row, never leftovers.

A batch smaller than its bucket is replayed with pad rows, and attention kernels index KV memory
with every row's metadata, pad rows included: engines crashed with an illegal memory access when
pad rows kept the positions of a previous, larger batch (SGLang #24401) or stale request-pool
indices (#22958). The zoo's ``index-checked`` model (``harness.models.index_checked``) indexes a
request pool with each row's position and request-pool slot, as those kernels do, and raises
``IllegalIndexError`` naming the row when one is out of range or unallocated, or when a pad row
holds anything but the padding fill (slot 0, position 0). Each bucket is replayed first with a
small batch (the capture's dummy left its positions in the static buffers), then with a batch that
fills it, then, after those requests finished and their pool slots were freed, with a small batch
again, so stale metadata would sit in its pad rows. Every call goes through ``check_run``.

Pad rows' values: the ``cross-token`` model (``harness.models.cross_token``) mixes rows inside its captured
segments, as a per-tensor activation scale does, so NaN in any pad row of a hidden input reaches every real row
(vLLM #40047). Its tests run under :func:`harness.hazards.uninitialised_memory_poisoned`, which makes rows that
were allocated and never written NaN on every backend."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from harness.batch import current_batch
from harness.graphs import eager_on_graph
from harness.hazards import amplifiers_enabled, uninitialised_memory_poisoned
from harness.models import build_model
from harness.models.engine import packed_causal_attention
from harness.models.index_checked import with_pool_slots
from harness.oracle import CALLING_MODES
from harness.runner import ForwardBatch
from harness.runner.cases import BUCKETS, CONFIG, SEED

pytestmark = pytest.mark.clause("buckets-and-padding")


def _small(bucket: int) -> tuple[int, ...]:
    """Just past the bucket below (1 token for the smallest): the most pad rows this bucket replays with."""
    below = max((b for b in BUCKETS if b < bucket), default=0)
    total = below + 1
    return (total,) if total < 3 else (total - total // 3, total // 3)


def _fill(bucket: int) -> tuple[int, ...]:
    """Requests that fill the bucket exactly, every row real."""
    return (bucket - bucket // 4, bucket // 4)


class _Scheduler:
    """Request-pool slots for each step's requests, freed when the step's requests finish; slots rotate, so a
    stale index left in a pad row names a slot that was freed."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.pool: Any = model.request_pool
        self.next = 1

    def admit(self, lengths: tuple[int, ...]) -> list[int]:
        slots = []
        for length in lengths:
            slots.append(self.next)
            self.pool.allocate(self.next, length)
            self.next = self.next % (self.pool.pool_size - 1) + 1
        return slots

    def finish(self, slots: list[int]) -> None:
        for slot in slots:
            self.pool.free(slot)


def _counting_pad_rows(runner: Any, pool: Any, seen: list[int]) -> Callable[[ForwardBatch], Any]:
    def run(batch: ForwardBatch) -> Any:
        before = pool.padding_rows_checked
        try:
            return runner.run(batch)
        finally:
            seen.append(pool.padding_rows_checked - before)
    run.__name__ = "run"
    return run


def _check_steps(build_runner: Callable[..., Any], check_run: Callable[..., Any], device: torch.device,
                 steps: list[tuple[int, str, tuple[int, ...]]]) -> None:
    """Run ``(bucket, step, lengths)`` in order on a fresh runner of the ``index-checked`` model, each batch's
    requests admitted to the pool before and finished after its call, and check attention read every pad row."""
    model = build_model("index-checked", seed=SEED, device=device)
    runner = build_runner(model)
    scheduler = _Scheduler(model)
    for index, (bucket, step, lengths) in enumerate(steps):
        slots = scheduler.admit(lengths)
        batch = with_pool_slots(ForwardBatch.from_lengths(lengths, vocab_size=CONFIG.vocab_size, seed=index,
                                                          device=device), slots)
        seen: list[int] = []
        check_run(runner, model, batch, via=_counting_pad_rows(runner, scheduler.pool, seen),
                  mode=CALLING_MODES[index % len(CALLING_MODES)], model="index-checked", bucket=bucket, step=step,
                  slots=slots)
        scheduler.finish(slots)
        pad_rows = (bucket - batch.num_tokens) * CONFIG.num_layers
        assert seen == [pad_rows], (
            f"{step} in bucket {bucket} ({batch.describe()}): attention checked {seen} pad rows, expected {pad_rows} "
            f"(its {bucket - batch.num_tokens} pad rows in each of {CONFIG.num_layers} layers): the replay did not "
            "hand attention the bucket's rows")


def test_pad_rows_after_a_larger_batch(build_runner, check_run, device):
    """In each bucket a batch that fills it, then, after its requests finished and their slots were freed, a
    small one: its pad rows hold the padding fill, not the larger batch's positions and request-pool indices."""
    _check_steps(build_runner, check_run, device,
                 [(bucket, step, lengths) for bucket in BUCKETS
                  for step, lengths in (("fills the bucket", _fill(bucket)),
                                        ("after a larger batch", _small(bucket)))])


def test_pad_rows_on_the_first_replay(build_runner, check_run, device):
    """The first replay of each bucket, with a small batch: its pad rows hold the padding fill, not what the
    capture's dummy batch left in the static buffers."""
    _check_steps(build_runner, check_run, device,
                 [(bucket, "first replay of the bucket", _small(bucket)) for bucket in BUCKETS])


def test_pad_rows_of_a_batch_that_arrived_padded(build_runner, check_run, device):
    """A batch arriving padded (its own pad rows, then the runner's) after a batch that filled its bucket: the
    caller's pad rows and the runner's hold the padding fill alike."""
    model = build_model("index-checked", seed=SEED, device=device)
    runner = build_runner(model)
    scheduler = _Scheduler(model)
    for index, (lengths, rows) in enumerate((((12, 4), None), ((5, 2), 11), ((3,), None))):
        slots = scheduler.admit(lengths)
        batch = with_pool_slots(ForwardBatch.from_lengths(lengths, vocab_size=CONFIG.vocab_size, seed=100 + index,
                                                          device=device), slots)
        batch = batch if rows is None else batch.padded_to(rows)
        check_run(runner, model, batch, model="index-checked", slots=slots)
        scheduler.finish(slots)


def _with_hidden_input(batch: ForwardBatch, *, seed: int) -> ForwardBatch:
    """``batch`` with a drawn ``deepstack_embeds`` hidden input, one row per token."""
    generator = torch.Generator().manual_seed(seed)
    embeds = torch.randn(batch.input_ids.shape[0], CONFIG.hidden_size, generator=generator)
    return ForwardBatch.from_lengths(batch.seq_lens, vocab_size=CONFIG.vocab_size, seed=seed, device=batch.device,
                                     side_inputs={"deepstack_embeds": embeds.to(batch.device)})


@pytest.mark.skipif(not amplifiers_enabled(), reason="the hazard amplifiers are off (--hazard-amplifiers off)")
def test_unwritten_pad_rows_reach_every_real_row(device):
    """Positive control of the amplifier and of the model: under ``uninitialised_memory_poisoned`` a pad row
    allocated and never written reads NaN, and the ``cross-token`` model carries it into every real row; the padding
    fill (zeros) leaves every real row finite."""
    model = build_model("cross-token", seed=SEED, device=device)
    batch = _with_hidden_input(ForwardBatch.from_lengths((3, 2), vocab_size=CONFIG.vocab_size, device=device), seed=7)
    padded = batch.padded_to(8)
    embeds = padded.side_inputs["deepstack_embeds"]
    with uninitialised_memory_poisoned(), torch.inference_mode():
        unwritten = embeds.new_empty(embeds.shape)
        unwritten[:batch.num_tokens] = embeds[:batch.num_tokens]
        assert unwritten[batch.num_tokens:].isnan().all(), "uninitialised_memory_poisoned left a fresh row finite"
        poisoned = model(padded.input_ids, padded.positions,
                         dataclasses.replace(padded, side_inputs={"deepstack_embeds": unwritten}))
        filled = model(padded.input_ids, padded.positions, padded)
    assert poisoned.next_token_logits.isnan().all(), (
        "NaN in the pad rows of the cross-token model's hidden input did not reach every real row's logits: "
        f"{int(poisoned.next_token_logits.isnan().sum())} of {poisoned.next_token_logits.numel()} are NaN")
    assert filled.next_token_logits.isfinite().all(), "the padding fill gave non-finite logits"


@eager_on_graph
def _attention_of_real_rows_only(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The zoo's attention, written as a kernel that computes only the live batch's tokens does: into a fresh
    output whose pad rows it never writes."""
    real = current_batch().num_tokens
    out = torch.empty_like(q)
    out[:real] = packed_causal_attention(q[:real], k[:real], v[:real])
    return out


@pytest.mark.skipif(not amplifiers_enabled(), reason="the hazard amplifiers are off (--hazard-amplifiers off)")
def test_unwritten_rows_of_a_break_output_reach_every_real_row(device):
    """Positive control for a break whose output's pad rows nobody writes (an attention backend that writes only the
    live tokens): run padded, as every replay of a smaller batch runs, under ``uninitialised_memory_poisoned`` those
    rows read NaN and the ``cross-token`` model carries them into every real row. This is engine model code, not a
    capturer's or runner's: no zoo model ships such a break, and the suites would fail it with any runner (the
    class's row in docs/hazards.md)."""
    model = build_model("cross-token", seed=SEED, device=device)
    batch = _with_hidden_input(ForwardBatch.from_lengths((3, 2), vocab_size=CONFIG.vocab_size, device=device), seed=7)
    padded = batch.padded_to(8)
    with uninitialised_memory_poisoned(), torch.inference_mode():
        written = model(padded.input_ids, padded.positions, padded)
        for layer in model.model.layers:
            layer.self_attn.kernel = _attention_of_real_rows_only
        unwritten = model(padded.input_ids, padded.positions, padded)
        unpadded = model(batch.input_ids, batch.positions, batch)
    assert written.next_token_logits.isfinite().all(), "the zoo's attention, which writes its pad rows, gave NaN"
    assert unpadded.next_token_logits.isfinite().all(), "unpadded, no row is left unwritten, yet the logits hold NaN"
    assert unwritten.next_token_logits.isnan().all(), (
        "NaN in the unwritten pad rows of the attention break's output did not reach every real row's logits: "
        f"{int(unwritten.next_token_logits.isnan().sum())} of {unwritten.next_token_logits.numel()} are NaN")


def test_pad_rows_of_hidden_inputs_stay_out_of_real_rows(build_runner, check_run, device):
    """The ``cross-token`` model, with a hidden input, in each bucket: a batch that fills it, then a small one,
    with fresh allocations NaN. Pad rows of every hidden input must hold finite values (the padding fill), or the
    cross-token op carries their NaN into every real row."""
    model = build_model("cross-token", seed=SEED, device=device)
    runner = build_runner(model)
    steps = [(bucket, step, lengths) for bucket in BUCKETS
             for step, lengths in (("fills the bucket", _fill(bucket)), ("after a larger batch", _small(bucket)))]
    with uninitialised_memory_poisoned():
        for index, (bucket, step, lengths) in enumerate(steps):
            batch = _with_hidden_input(ForwardBatch.from_lengths(lengths, vocab_size=CONFIG.vocab_size,
                                                                 device=device), seed=200 + index)
            check_run(runner, model, batch, mode=CALLING_MODES[index % len(CALLING_MODES)], model="cross-token",
                      bucket=bucket, step=step)
