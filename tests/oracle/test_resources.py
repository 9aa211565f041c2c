"""Resources as observables: the storage behind an output, what stays alive, what a long run grows. Each check
has a positive control (a call made to hold on to something) and a negative one (eager's own behaviour)."""

from __future__ import annotations

import pytest
import torch

from harness.errors import MismatchError
from harness.oracle import Checker, _resources, check_call

X = torch.arange(12.0).reshape(4, 3)


def test_an_output_that_is_a_narrow_view_of_a_larger_buffer_is_caught():
    def narrow_view():
        buffer = torch.empty(64, 3)
        buffer[:2] = X[:2]
        return buffer[:2]  # same values, shape and strides as eager's; 32 times the storage

    with pytest.raises(MismatchError, match=r"output storage: result keeps 768 bytes .* eager's 24 bytes"):
        check_call("toy", narrow_view, lambda: X[:2].clone(), inputs=(X,), exact=True)
    check_call("toy", lambda: X[:2].clone(), lambda: X[:2].clone(), inputs=(X,), exact=True)


def test_an_output_holding_what_eager_holds_passes():
    # Eager's outputs are views of one buffer: an implementation may return the same.
    check_call("toy", lambda: X.clone().unbind(0), lambda: X.clone().unbind(0), inputs=(X,), exact=True)


_CACHE: list[object] = []


def test_an_implementation_keeping_its_inputs_alive_is_caught():
    def session(keeps: bool):
        def run():
            model = torch.nn.Linear(3, 2)
            inputs = torch.randn(4, 3)
            output = model(inputs)
            if keeps:
                _CACHE.append(inputs)  # a strong reference the caller cannot drop
            return {"model": model, "inputs": inputs, "outputs": (output,)}
        return run

    checker = Checker("toy")
    checker.released(session(False), session(False))  # the control: nothing kept
    try:
        with pytest.raises(MismatchError, match=r"objects kept alive: inputs still alive"):
            checker.released(session(True), session(False))
    finally:
        _CACHE.clear()


def test_what_eager_keeps_alive_the_candidate_may_keep():
    kept = torch.ones(2)

    def run():
        return {"constant": kept}  # alive through this test's own reference, on both sides

    assert _resources.survivors(run) == ["constant"]
    Checker("toy").released(run, run)


def test_a_cache_that_grows_with_every_call_is_caught():
    cache = []

    def eager():
        (X * 2).sum()

    def grows():
        cache.append((X * 2).clone())  # one tensor more per call, never dropped

    checker = Checker("toy")
    checker.steady(eager, eager, calls=8)  # the control: a steady call adds nothing
    with pytest.raises(MismatchError, match=r"growth over a run: .*tensors \+8 \(eager's \+0\)"):
        checker.steady(grows, eager, calls=8)


def test_a_warm_up_that_allocates_once_is_not_growth():
    warm: list[torch.Tensor] = []

    def warms_once():
        if not warm:
            warm.append(torch.empty(1024))
        (X * 2).sum()

    Checker("toy").steady(warms_once, lambda: (X * 2).sum(), calls=4)
