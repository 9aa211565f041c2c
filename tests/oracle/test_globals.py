"""The settings the checker observes come from walking the installed torch: a new one is found with no code change."""

from __future__ import annotations

import types

import pytest
import torch

from harness.errors import MismatchError
from harness.oracle import _globals, _state, check_call, process_state_kept

X = torch.arange(6.0)


@pytest.fixture
def fancy_mode(monkeypatch):
    """A setting torch does not have: ``torch.is_fancy_mode_enabled``/``torch.set_fancy_mode_enabled``, as a
    future torch would add one; the discovery cache is cleared so that it is walked again."""
    state = {"on": False}

    def is_fancy_mode_enabled() -> bool:
        return state["on"]

    def set_fancy_mode_enabled(on: bool) -> None:
        state["on"] = on

    monkeypatch.setattr(torch, "is_fancy_mode_enabled", is_fancy_mode_enabled, raising=False)
    monkeypatch.setattr(torch, "set_fancy_mode_enabled", set_fancy_mode_enabled, raising=False)
    _globals._discovered.cache_clear()
    yield state
    monkeypatch.undo()
    _globals._discovered.cache_clear()


def test_a_new_torch_setting_is_observed_without_code_change(fancy_mode):
    found = {setting.name: setting for setting in _globals.settings()}
    assert "torch.is_fancy_mode_enabled" in found
    assert found["torch.is_fancy_mode_enabled"].write is not None  # paired with its setter by name
    assert _state.process_state()["torch.is_fancy_mode_enabled"] is False


def test_a_call_that_flips_a_new_setting_and_leaves_it_is_caught(fancy_mode):
    def flips_it():
        torch.set_fancy_mode_enabled(True)
        return X * 2

    with pytest.raises(MismatchError, match=r"process state: .*torch\.is_fancy_mode_enabled"):
        check_call("toy", flips_it, lambda: X * 2, inputs=(X,), exact=True)
    fancy_mode["on"] = False
    check_call("toy", lambda: X * 2, lambda: X * 2, inputs=(X,), exact=True)  # the control: nothing flipped


def test_a_smoke_call_puts_a_new_setting_back(fancy_mode):
    with process_state_kept():
        torch.set_fancy_mode_enabled(True)
    assert fancy_mode["on"] is False


def test_the_walk_finds_the_kinds_of_state_the_issue_names():
    names = {setting.name for setting in _globals.settings()}
    for expected in ("torch.is_grad_enabled", "torch.get_default_dtype", "torch.are_deterministic_algorithms_enabled",
                     "torch.get_num_threads", "torch.get_float32_matmul_precision",
                     "torch.is_autocast_enabled('cpu')", "torch.get_autocast_dtype('cpu')",
                     "torch.backends.mkldnn.enabled", "torch.backends.opt_einsum.enabled",
                     "torch._C._get_cublas_allow_tf32"):
        assert expected in names
    assert "torch.get_rng_state" not in names  # the random stream is a fact of its own


def test_getters_that_need_an_argument_or_warn_or_return_objects_are_not_settings(monkeypatch):
    monkeypatch.setattr(torch, "get_widget", lambda widget: 1, raising=False)  # needs an argument
    monkeypatch.setattr(torch, "get_thing_object", lambda: object(), raising=False)  # not a comparable value

    def get_old_flag() -> bool:
        import warnings

        warnings.warn("deprecated", DeprecationWarning, stacklevel=1)
        return True

    monkeypatch.setattr(torch, "get_old_flag", get_old_flag, raising=False)
    _globals._discovered.cache_clear()
    try:
        names = {setting.name for setting in _globals.settings()}
    finally:
        monkeypatch.undo()
        _globals._discovered.cache_clear()
    assert not names & {"torch.get_widget", "torch.get_thing_object", "torch.get_old_flag"}


def test_every_deny_entry_says_why():
    assert all(isinstance(reason, str) and len(reason) > 10 for reason in _globals.NOT_STATE.values())


def test_a_backend_flag_module_is_read_through_its_properties_and_its_wrapped_module(monkeypatch):
    wrapped = types.ModuleType("fancy_backend")
    wrapped.enabled = True
    module = torch.backends.PropModule(wrapped, "torch.backends.fancy")
    monkeypatch.setattr(torch.backends, "fancy", module, raising=False)
    _globals._discovered.cache_clear()
    try:
        found = {setting.name: setting for setting in _globals.settings()}
        assert found["torch.backends.fancy.enabled"].read() is True
        found["torch.backends.fancy.enabled"].write(False)  # as a user sets it: on the flag module
        assert module.enabled is False and found["torch.backends.fancy.enabled"].read() is False
    finally:
        monkeypatch.undo()
        _globals._discovered.cache_clear()
