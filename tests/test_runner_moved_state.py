"""The reference runner's moved-state check (``LayerStackRunner.state_moved``): a graph reads the memory and geometry
its parameters and buffers had at capture, so the check must see every way an engine re-allocates or reshapes them
between replays, and nothing else (a new Parameter object over the same memory is still what the graph reads)."""

from __future__ import annotations

import pytest
import torch

from harness.graphs import GraphCapturer, get_backend
from harness.models import build_model
from harness.runner import LayerStackRunner


def _runner() -> LayerStackRunner:
    model = build_model("dense", seed=0, dtype=torch.float32)
    return LayerStackRunner(model, buckets=(4,), graphs=GraphCapturer(get_backend("emulated")))


def _first_parameter(runner: LayerStackRunner) -> tuple[torch.nn.Module, str]:
    module = next(m for m in runner.model.modules() if "weight" in m._parameters and m.weight.dim() == 2)
    return module, "weight"


def _replaced_by_a_clone(module, name):
    setattr(module, name, torch.nn.Parameter(getattr(module, name).detach().clone()))


def _data_cloned(module, name):
    getattr(module, name).data = getattr(module, name).data.clone()


def _shrunk_in_place(module, name):
    parameter = getattr(module, name).requires_grad_(False)  # autograd refuses to resize a tensor that needs grad
    parameter.resize_(1, parameter.shape[1])


def _transposed_over_the_same_memory(module, name):
    getattr(module, name).data = getattr(module, name).data.t()


def _reinterpreted_as_another_dtype(module, name):
    getattr(module, name).data = getattr(module, name).data.view(torch.int32)


def _emptied(module, name):
    module._parameters[name] = None


@pytest.mark.parametrize("move", [_replaced_by_a_clone, _data_cloned, _shrunk_in_place,
                                  _transposed_over_the_same_memory, _reinterpreted_as_another_dtype, _emptied])
def test_every_re_allocation_or_reshape_of_a_parameter_is_seen(move):
    runner = _runner()
    assert not runner.state_moved()
    move(*_first_parameter(runner))
    assert runner.state_moved(), move.__name__


def test_a_new_parameter_object_over_the_same_memory_is_not_a_move():
    runner = _runner()
    module, name = _first_parameter(runner)
    setattr(module, name, torch.nn.Parameter(getattr(module, name).data))
    assert not runner.state_moved()


def test_a_re_allocated_buffer_is_seen():
    runner = _runner()
    module = next(m for m in runner.model.modules() if m._buffers and any(b is not None for b in m._buffers.values()))
    name = next(key for key, buffer in module._buffers.items() if buffer is not None)
    assert not runner.state_moved()
    module._buffers[name] = module._buffers[name].clone()
    assert runner.state_moved()
