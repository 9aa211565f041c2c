"""Positive controls of the hazard amplifiers (harness.hazards) on CUDA: each makes a known hazard fail for certain.

An amplifier that silently stops working (a torch whose memory snapshot changed form, a stream API that no longer
goes through ``torch.cuda.set_stream``) would let every hazard it exists for pass again unnoticed; these tests
fail then. They drive torch's own CUDA graphs and streams, not the implementation under test: what they check is
the amplifier. On the emulated backend there is nothing to amplify (it raises at the hazard itself)."""

from __future__ import annotations

import pytest
import torch

from harness import hazards
from harness.errors import MismatchError
from harness.oracle import Checker, checks_stop

pytestmark = pytest.mark.clause("hazards")


@pytest.fixture(autouse=True)
def _cuda_only(device):
    if device.type != "cuda":
        pytest.skip("the hazard amplifiers act on CUDA memory and streams; the emulated backend raises at the hazard "
                    "itself (GraphHazardError, StreamHazardError)")


def _bytes_at(block: hazards.FreeBlock) -> torch.Tensor:
    """A copy of the bytes of a free block, read by address."""
    from harness.hazards._poison import _RawMemory

    return torch.as_tensor(_RawMemory(block.address, block.size), device=f"cuda:{block.device}").clone()


def _graph_reading_a_released_input(device: torch.device) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
    """A graph of ``y = x * 2 + 1`` whose input ``x`` its owner has released since the capture (the graph holds its
    address only), and what a replay with ``x`` alive gives: the replay reads whatever the allocator left at that
    address, which the allocator hands to nothing before the replay here."""
    x = torch.randn(4096, device=device)
    expected = x * 2 + 1
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2 + 1
    del x
    torch.cuda.synchronize()
    return graph, y, expected


def test_poison_makes_a_replay_over_released_memory_read_nan(device):
    graph, y, _ = _graph_reading_a_released_input(device)
    report = hazards.poison_free_memory(force=True)
    graph.replay()
    torch.cuda.synchronize()
    assert report.blocks > 0 and report.bytes >= 4096 * 4, f"nothing poisoned: {report}"
    assert torch.isnan(y).all(), (f"{int((~torch.isnan(y)).sum())} of {y.numel()} elements of a replay over a released "
                                  "input are not NaN after poisoning: the freed block was not filled")


@pytest.mark.parametrize("change", ["grown", "set to another storage"])
def test_poison_makes_a_replay_over_a_moved_input_read_nan(device, change):
    """PyTorch #191589: ``resize_`` past a captured tensor's storage, or ``set_`` to another one, moves its memory; the
    graph keeps the old address, which is free once the tensor moved, and poisoning fills it."""
    x = torch.randn(4096, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2 + 1
    if change == "grown":
        x.resize_(1 << 20)
    else:
        x.set_(torch.randn(4096, device=device))
    torch.cuda.synchronize()
    hazards.poison_free_memory(force=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isnan(y).all(), (f"{int((~torch.isnan(y)).sum())} of {y.numel()} elements of a replay over an input "
                                  f"{change} since the capture are not NaN after poisoning: its old block was not "
                                  "filled")


def test_the_checker_fails_a_replay_over_released_memory(device):
    if not hazards.amplifiers_enabled():
        pytest.skip("the hazard amplifiers are off in this run (--hazard-amplifiers off)")
    graph, y, expected = _graph_reading_a_released_input(device)

    def replay() -> torch.Tensor:
        graph.replay()
        return y

    # eager hands back the values computed before the release, allocating nothing that could take the freed block
    with checks_stop(), pytest.raises(MismatchError, match="values"):
        Checker("graphs").call(replay, lambda: expected, exact=False)


def test_poison_fills_the_free_blocks_of_a_graph_pool_and_the_graph_still_replays_right(device):
    x = torch.randn(1 << 16, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        scratch = x * 2  # released inside the capture: a free block of the graph's pool, written at every replay
        y = scratch.sum() + 1
        del scratch
    hazards.poison_free_memory(force=True)
    pooled = [block for block in hazards.free_blocks(torch.cuda.memory_snapshot())
              if block.pool == tuple(graph.pool())]
    assert pooled, f"no free block in the graph's pool {graph.pool()} after its capture released its scratch"
    for block in pooled:
        contents = _bytes_at(block)
        assert (contents == hazards.POISON_BYTE).all(), (
            f"{int((contents != hazards.POISON_BYTE).sum())} of {block.size} bytes of a free block of the graph's pool "
            f"at {block.address:#x} are not poison")
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(y, (x.double() * 2).sum().float() + 1, rtol=1e-4, atol=1e-3)


def test_widened_races_make_a_read_of_an_unjoined_side_stream_early(device):
    """A reader on the caller's stream, queued right after a side stream's write it never waited for, reads before
    the write. The spin is a time: a host stalled longer than it between queuing the write and the reader (a
    preempted test process) sees the write done, so of three attempts one early read is the claim."""
    source = torch.ones(1 << 16, device=device)
    side = torch.cuda.Stream(device)
    early = 0
    for _ in range(3):
        written = torch.zeros_like(source)
        with hazards.widened_races(force=True):
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                written.copy_(source * 2)
            seen = written.clone()  # on the caller's stream, which never waited for the side stream
        torch.cuda.synchronize()
        assert (written == 2).all(), "the side stream's write did not happen"
        early += bool((seen == 0).all())
    assert early >= 1, ("in none of 3 attempts did a read on the caller's stream come before the unjoined side "
                        "stream's write: the side stream was not delayed")
