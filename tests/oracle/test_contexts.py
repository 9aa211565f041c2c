"""Every setting a caller can set is a context hypothesis draws around checked calls, eager in the same context."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from harness.errors import MismatchError
from harness.oracle import ALLOWED, Checker, _contexts, _globals
from harness.oracle._allowed import NOT_DRAWN

X = torch.arange(6.0)


def test_the_settable_settings_come_with_values_torch_takes():
    found = _contexts.settable()
    assert torch.float64 in found["torch.get_default_dtype"][1]
    assert found["torch.are_deterministic_algorithms_enabled"][1] == (True,)
    assert "torch.is_autocast_enabled('cpu')" in found
    assert not set(found) & set(NOT_DRAWN)
    for name, (setting, values) in found.items():
        assert setting.read() not in values, f"{name}: the current value is no new context"


def test_a_new_settable_torch_setting_is_drawn_without_code_change(monkeypatch):
    state = {"on": False}
    monkeypatch.setattr(torch, "is_fancy_mode_enabled", lambda: state["on"], raising=False)
    monkeypatch.setattr(torch, "set_fancy_mode_enabled", lambda on: state.update(on=on), raising=False)
    _globals._discovered.cache_clear()
    _contexts.settable.cache_clear()
    try:
        assert _contexts.settable()["torch.is_fancy_mode_enabled"][1] == (True,)
        with _contexts.caller_context_applied({"torch.is_fancy_mode_enabled": True}):
            assert state["on"] is True
        assert state["on"] is False
    finally:
        monkeypatch.undo()
        _globals._discovered.cache_clear()
        _contexts.settable.cache_clear()


def test_a_context_is_set_for_the_block_and_put_back():
    before = (torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled())
    with _contexts.caller_context_applied({"torch.get_default_dtype": torch.float64,
                                           "torch.are_deterministic_algorithms_enabled": True}):
        assert (torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled()) == (torch.float64, True)
    assert (torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled()) == before


def test_no_context_is_drawn_outside_a_hypothesis_example():
    assert _contexts.drawn_caller_context("toy") == {}


def test_an_explicit_example_runs_in_no_drawn_context_and_generated_ones_draw():
    seen: list[tuple[int, dict]] = []

    @settings(max_examples=30, database=None, derandomize=True)
    @given(st.integers(0, 9))
    @example(-1)
    def body(number):
        seen.append((number, _contexts.drawn_caller_context("gather")))

    body()
    assert seen[0] == (-1, {}), "an explicit example has no choices to draw from: it must run as written"
    assert any(context for number, context in seen[1:]), "generated examples draw contexts"


def test_a_component_allowed_to_ignore_contexts_draws_none(monkeypatch):
    monkeypatch.setitem(ALLOWED, ("toy", "caller context"), "a toy that replays what it recorded")

    @settings(max_examples=20, database=None, deadline=None)
    @given(st.data())
    def draws(data):
        assert _contexts.drawn_caller_context("toy") == {}

    draws()


def test_a_call_wrong_only_under_a_drawn_context_is_caught():
    """The positive control: a candidate that ignores the default dtype (always float32) passes every call made
    outside a drawn context and fails once hypothesis draws the default dtype, which eager honours."""

    def ignores_default_dtype():
        return torch.zeros(3, dtype=torch.float32) + 1

    def eager():
        return torch.zeros(3) + 1

    Checker("toy").call(ignores_default_dtype, eager, exact=True)  # no context drawn: alike

    @settings(max_examples=200, database=None, deadline=None)
    @given(st.integers())
    def checked(_):
        Checker("toy").call(ignores_default_dtype, eager, exact=True)

    drawn_dtype = r"caller context: .*torch\.get_default_dtype=torch\.(float64|bfloat16|float16)"
    with pytest.raises(MismatchError, match=drawn_dtype):
        checked()
