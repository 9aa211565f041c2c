"""Hidden-state modes: none returns no hidden states (and allocates none), last and full equal the
eager selection (every call through ``check_run``)."""

from __future__ import annotations

import pytest
import torch

from harness.runner.cases import CONFIG, make_batch

pytestmark = pytest.mark.clause("hidden-states")

LENGTHS = ([1], [4, 3], [2, 7, 1, 5])


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if hasattr(value, "__dict__"):
        return [t for item in vars(value).values() for t in _tensors(item)]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


@pytest.mark.parametrize("name", ["dense", "moe"])
@pytest.mark.parametrize("mode", ["none", "last", "full"])
@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
def test_hidden_state_mode(zoo_runner, check_run, device, name, mode, lengths):
    model, runner = zoo_runner(name)
    batch = make_batch(name, lengths, seed=len(lengths), dtype=torch.float32, device=device, hidden_mode=mode)
    actual = check_run(runner, model, batch, model=name, seed=len(lengths), hidden_mode=mode)
    expected_rows = {"none": None, "last": len(lengths), "full": sum(lengths)}[mode]
    if expected_rows is None:
        assert actual.hidden_states is None, f"mode none returned hidden states {tuple(actual.hidden_states.shape)}"
        hidden_sized = [tuple(t.shape) for t in _tensors(actual) if t.shape[-1] == CONFIG.hidden_size]
        assert not hidden_sized, f"mode none still handed out hidden-state tensors of shapes {hidden_sized}"
    else:
        assert tuple(actual.hidden_states.shape) == (expected_rows, CONFIG.hidden_size)
