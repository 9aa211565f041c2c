"""Every setting a caller can set is a context hypothesis draws around checked calls, eager in the same context."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from harness.errors import HarnessError, MismatchError
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


def _toy_lifecycle(monkeypatch) -> None:
    monkeypatch.setitem(ALLOWED, ("toy", "caller context changed after capture"), "a toy that replays what it "
                                                                                   "captured, in the capture's context")


def test_a_lifecycle_context_is_held_from_the_first_capture_to_the_example_end(monkeypatch):
    _toy_lifecycle(monkeypatch)
    names = list(_contexts.settable())
    outside = _globals.read(_globals.settings())
    held: list[dict] = []

    @settings(max_examples=30, database=None, derandomize=True, deadline=None)
    @given(st.integers(0, 3))
    def body(replays):
        assert _contexts.example_caller_context("toy", enter=False) == {}, "nothing captured yet: no context"
        context = _contexts.example_caller_context("toy")  # the capture
        for _ in range(replays + 1):  # every later step of the example sees the same context, in force
            assert _contexts.example_caller_context("toy", enter=False) == context
            assert _contexts.example_caller_context("toy") == context, "drawn once per example"
            for name, value in context.items():
                assert _contexts.settable()[name][0].read() == value, f"{name} not in force"
        held.append(dict(context))

    body()
    assert any(held), "positive control: some example held a context"
    assert _globals.read(_globals.settings()) == outside, "every setting put back when its example ended"
    assert set(names) >= {name for context in held for name in context}


def test_a_call_of_a_lifecycle_component_runs_eager_in_the_held_context(monkeypatch):
    _toy_lifecycle(monkeypatch)
    seen: list[tuple[torch.dtype, torch.dtype, torch.dtype]] = []

    @settings(max_examples=40, database=None, derandomize=True, deadline=None)
    @given(st.data())
    def body(data):
        checker = Checker("toy")
        captured = checker.construct(lambda: torch.get_default_dtype(), modules=())
        eager_dtype: list[torch.dtype] = []
        checker.call(lambda: torch.ones(2, dtype=captured), lambda: eager_dtype.append(torch.get_default_dtype())
                     or torch.ones(2), exact=True)
        seen.append((captured, eager_dtype[0], torch.get_default_dtype()))

    body()
    assert all(captured == eager == now for captured, eager, now in seen)
    assert any(captured != torch.float32 for captured, _, _ in seen), "positive control: another default dtype held"


def test_a_capture_in_another_context_than_the_callers_is_caught(monkeypatch):
    """The mutants' bug: a capture that ignores the caller's default dtype differs from eager in the held context."""
    _toy_lifecycle(monkeypatch)

    @settings(max_examples=60, database=None, derandomize=True, deadline=None)
    @given(st.data())
    def body(data):
        checker = Checker("toy")
        captured = checker.construct(lambda: torch.float32, modules=())  # captured in float32, whatever is set
        checker.call(lambda: torch.ones(2, dtype=captured), lambda: torch.ones(2), exact=True)

    with pytest.raises(MismatchError, match="caller context"):
        body()


def test_threads_started_in_an_example_serve_in_its_held_context(monkeypatch):
    from harness.oracle.concurrency import run_in_threads

    _toy_lifecycle(monkeypatch)
    monkeypatch.setattr(_contexts, "caller_contexts",
                        lambda component, **_: st.just({"torch.is_autocast_enabled('cpu')": True}))

    @settings(max_examples=1, database=None, deadline=None)
    @given(st.data())
    def body(data):
        _contexts.example_caller_context("toy")
        assert run_in_threads([lambda: torch.is_autocast_enabled("cpu")] * 2) == [True, True]

    body()
    assert not torch.is_autocast_enabled("cpu")


def test_cache_keys_follow_the_held_context(monkeypatch):
    _toy_lifecycle(monkeypatch)
    keys: set[str] = set()

    @settings(max_examples=30, database=None, derandomize=True, deadline=None)
    @given(st.data())
    def body(data):
        key = _contexts.context_key("toy")
        assert key == _contexts.described(_contexts.example_caller_context("toy", enter=False))
        keys.add(key)

    body()
    assert "" in keys and len(keys) > 1, "one key with no context, others per context"


def test_autocast_dtypes_torch_autocast_refuses_are_not_drawn():
    assert not _contexts._autocast_takes("torch.get_autocast_dtype('cpu')", torch.float64)
    assert _contexts._autocast_takes("torch.get_autocast_dtype('cpu')", torch.float16)
    assert torch.float64 not in _contexts.settable()["torch.get_autocast_dtype('cpu')"][1]


def test_engine_configurations_set_every_settable_setting_once_and_are_what_a_dear_component_draws(monkeypatch):
    configurations = _contexts.engine_configurations("runner", 3)
    assert len(configurations) == 3
    names = [name for configuration in configurations for name in configuration]
    assert len(names) == len(set(names)), "each setting in one configuration"
    settable = _contexts.settable()
    left_out = set(settable) - set(names)
    assert len(left_out) <= 1, f"settings no configuration takes: {sorted(left_out)}"
    for configuration in configurations:
        assert _contexts._consistent(configuration)
        for name, value in configuration.items():
            assert value in settable[name][1]
    monkeypatch.setitem(_contexts.CONFIGURATIONS, "toy", 2)
    _toy_lifecycle(monkeypatch)
    drawn: list[dict] = []

    @settings(max_examples=40, database=None, derandomize=True, deadline=None)
    @given(st.data())
    def body(data):
        drawn.append(_contexts.example_caller_context("toy"))

    body()
    allowed = [{}, *_contexts.engine_configurations("toy", 2)]
    assert all(context in allowed for context in drawn)
    assert {} in drawn and any(drawn), "none, and a configuration"


def test_a_held_context_torch_does_not_put_back_fails_the_example_loudly(monkeypatch):
    """Positive controls of the leak checks: a one-way setting (its setter cannot set it back) is never drawn; one
    that turns one-way only later, inside an example, would carry that example's context into every later one, and
    the example's end says so, naming the setting."""
    state = {"on": False, "one_way": True}

    def write(on: bool) -> None:
        if on or not state["one_way"]:
            state["on"] = on

    monkeypatch.setattr(torch, "is_sticky_mode_enabled", lambda: state["on"], raising=False)
    monkeypatch.setattr(torch, "set_sticky_mode_enabled", write, raising=False)
    _globals._discovered.cache_clear()
    _contexts.settable.cache_clear()
    try:
        assert "torch.is_sticky_mode_enabled" not in _contexts.settable(), "a setting torch cannot set back is drawn"
        state.update(on=False, one_way=False)
        _contexts.settable.cache_clear()
        assert "torch.is_sticky_mode_enabled" in _contexts.settable()
        _toy_lifecycle(monkeypatch)
        monkeypatch.setattr(_contexts, "held_contexts",
                            lambda component: st.just({"torch.is_sticky_mode_enabled": True}))

        @settings(max_examples=1, database=None, derandomize=True, deadline=None)
        @given(st.data())
        def body(data):
            state.update(on=False, one_way=True)  # it turns one-way now; each run of the example leaks anew
            data.draw(st.integers(0, 3))  # an example of no choices at all would replay as an explicit one
            _contexts.example_caller_context("toy")

        with pytest.raises(HarnessError, match=r"not put back.*torch\.is_sticky_mode_enabled False -> True"):
            body()
    finally:
        monkeypatch.undo()
        _globals._discovered.cache_clear()
        _contexts.settable.cache_clear()


def test_a_held_context_entered_inside_a_block_setting_the_same_setting_fails_loudly_and_leaks_nothing(monkeypatch):
    """Positive control: the block set the precision, the context was entered inside it, the block ended first. Put
    back as the context found it, the block's value would outlive the example; the example fails, naming it, and the
    precision is left as the block left it."""
    _toy_lifecycle(monkeypatch)
    monkeypatch.setattr(_contexts, "held_contexts",
                        lambda component: st.just({"torch.get_float32_matmul_precision": "high"}))
    outside = torch.get_float32_matmul_precision()

    @settings(max_examples=1, database=None, derandomize=True, deadline=None)
    @given(st.data())
    def body(data):
        data.draw(st.integers(0, 3))  # an example of no choices at all would replay as an explicit one
        torch.set_float32_matmul_precision("medium")
        try:
            _contexts.example_caller_context("toy")
        finally:
            torch.set_float32_matmul_precision(outside)

    with pytest.raises(HarnessError, match=r"does not nest.*get_float32_matmul_precision reads 'highest'"):
        body()
    assert torch.get_float32_matmul_precision() == outside
