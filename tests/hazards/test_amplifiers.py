"""The hazard amplifiers' logic off the GPU: which blocks poisoning fills, when the amplifiers act, and what the
race widener queues on which stream (torch's CUDA entry points stood in for). Their effect on real CUDA memory and
streams is shown by the positive controls, suites/graphs/test_hazard_amplifiers.py, on a GPU."""

from __future__ import annotations

import threading

import pytest
import torch

from harness import hazards
from harness.hazards import FreeBlock, free_blocks


def _segment(address, blocks, *, device=0, pool=(0, 0), addresses=True):
    listed, at = [], address
    for size, state in blocks:
        listed.append({"size": size, "state": state, **({"address": at} if addresses else {})})
        at += size
    return {"device": device, "address": address, "segment_pool_id": pool, "blocks": listed}


@pytest.mark.parametrize("addresses", [True, False], ids=["block addresses", "running sum"])
def test_free_blocks_are_the_inactive_ones_at_their_addresses_in_every_pool(addresses):
    segments = [
        _segment(4096, [(512, "active_allocated"), (1024, "inactive"), (512, "active_pending_free"),
                        (2048, "inactive")], addresses=addresses),
        _segment(1 << 20, [(256, "inactive"), (768, "active_allocated")], device=1, pool=(3, 7), addresses=addresses),
    ]
    assert free_blocks(segments) == [FreeBlock(0, 4096 + 512, 1024, (0, 0)),
                                     FreeBlock(0, 4096 + 2048, 2048, (0, 0)),
                                     FreeBlock(1, 1 << 20, 256, (3, 7))]


def test_no_free_block_in_a_snapshot_without_one():
    assert free_blocks([_segment(0, [(512, "active_allocated")])]) == []
    assert free_blocks([]) == []


def test_cuda_memory_is_left_alone_where_cuda_is_not_initialised(monkeypatch):
    from harness.hazards import _poison

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # on a GPU machine too
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *args, **kwargs: pytest.fail("a snapshot was read"))
    monkeypatch.setattr(_poison, "poison_free_blocks", lambda byte: (2, 64))  # the emulated pools' part
    assert hazards.poison_free_memory(force=True) == hazards.PoisonReport(2, 64)


def test_nothing_is_poisoned_where_the_amplifiers_are_off(monkeypatch):
    from harness.hazards import _poison

    monkeypatch.setenv(hazards.AMPLIFIERS_VARIABLE, "off")
    monkeypatch.setattr(_poison, "poison_free_blocks", lambda byte: pytest.fail("emulated pools were poisoned"))
    assert hazards.poison_free_memory() == hazards.PoisonReport()


def test_the_amplifiers_follow_the_run_setting_and_pause_in_every_thread(monkeypatch):
    monkeypatch.delenv(hazards.AMPLIFIERS_VARIABLE, raising=False)
    assert hazards.amplifiers_enabled()
    seen = []
    with hazards.amplifiers_paused():
        worker = threading.Thread(target=lambda: seen.append(hazards.amplifiers_enabled()))
        worker.start()
        worker.join()
        with hazards.amplifiers_paused():
            pass
        assert not hazards.amplifiers_enabled()
    assert seen == [False] and hazards.amplifiers_enabled()
    monkeypatch.setenv(hazards.AMPLIFIERS_VARIABLE, "off")
    assert not hazards.amplifiers_enabled()


class _Stream:
    def __init__(self, name: str, device: str = "cuda:0") -> None:
        self.name, self.device = name, device

    def __repr__(self) -> str:
        return self.name


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch's CUDA stream entry points stood in for: the stream switches and spins they were asked for, in order."""
    calls: list = []
    default = _Stream("default")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: calls.append(("set", stream)))
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: default)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append(("spin", cycles)))
    monkeypatch.delenv(hazards.AMPLIFIERS_VARIABLE, raising=False)
    return calls, default


def test_a_switch_to_a_side_stream_queues_a_spin_there_and_the_default_stream_none(fake_cuda):
    calls, default = fake_cuda
    side = _Stream("side")
    original = torch.cuda.set_stream
    with hazards.widened_races(cycles=123):
        torch.cuda.set_stream(side)
        torch.cuda.set_stream(default)
        torch.cuda.set_stream(None)
        with hazards.widened_races(cycles=999):  # an inner block changes nothing
            torch.cuda.set_stream(side)
        with hazards.amplifiers_paused():
            torch.cuda.set_stream(side)
    assert torch.cuda.set_stream is original
    torch.cuda.set_stream(side)
    assert calls == [("set", side), ("spin", 123), ("set", default), ("set", None),
                     ("set", side), ("spin", 123), ("set", side), ("set", side)]


def test_races_are_not_widened_where_the_amplifiers_are_off(fake_cuda, monkeypatch):
    calls, _ = fake_cuda
    monkeypatch.setenv(hazards.AMPLIFIERS_VARIABLE, "off")
    side = _Stream("side")
    with hazards.widened_races():
        torch.cuda.set_stream(side)
    with hazards.widened_races(cycles=5, force=True):
        torch.cuda.set_stream(side)
    assert calls == [("set", side), ("set", side), ("spin", 5)]
