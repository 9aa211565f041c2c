"""The observational checker against hand-made calls whose one difference from eager is known."""

from __future__ import annotations

import gc

import pytest
import torch

from harness.errors import MismatchError
from harness.oracle import ALLOWED, CALLING_MODES, Checker, calling_mode, check_call, process_state_kept

X = torch.arange(12.0).reshape(4, 3)
INDEX = torch.tensor([0, 2])


def _fails(candidate, eager, *, fact, component="toy", modules=(), inputs=(X, INDEX), mode=None, exact=True):
    with pytest.raises(MismatchError, match=fact) as failure:
        check_call(component, candidate, eager, inputs=inputs, modules=modules, exact=exact, mode=mode)
    return str(failure.value)


def test_an_equal_call_passes_and_returns_the_candidates_result():
    result = torch.empty(0)

    def candidate():
        nonlocal result
        result = X[INDEX].clone()
        return result

    assert check_call("toy", candidate, lambda: X[INDEX], inputs=(X, INDEX), exact=True) is result


def test_strides_are_compared_where_they_address_elements():
    _fails(lambda: X[INDEX].t().contiguous().t(), lambda: X[INDEX], fact="output strides")
    row = torch.ones(1, 3)
    check_call("toy", lambda: row.t().contiguous().t().clone(), lambda: row.clone(), exact=True)  # size-1 dim
    empty = torch.empty(0, 4, 5)
    check_call("toy", lambda: empty.clone(), lambda: torch.empty_strided((0, 4, 5), (20, 1, 4)),
               exact=True)  # an empty result: strides address nothing (the compiled gather's empty index, seen)


def test_aliasing_an_input_that_eager_does_not_is_caught():
    message = _fails(lambda: X[:2], lambda: X[torch.tensor([0, 1])], fact="output aliasing")
    assert "input[0]" in message


def test_autograd_facts_follow_the_callers_mode():
    weight = torch.ones(3, requires_grad=True)
    for mode in CALLING_MODES:
        check_call("toy", lambda: X * weight, lambda: X * weight, exact=True, mode=mode)
    _fails(lambda: (X * weight).detach(), lambda: X * weight, fact="output requires_grad", mode="grad")

    def made_outside_inference():
        with torch.inference_mode(False):
            return X * 2

    _fails(made_outside_inference, lambda: X * 2, fact="output is_inference", mode="inference_mode")


@pytest.mark.parametrize(("leak", "name"), [
    (lambda: torch.set_grad_enabled(False), "torch.is_grad_enabled"),
    (lambda: torch.set_default_dtype(torch.float64), "torch.get_default_dtype"),
    (gc.disable, "gc.isenabled"),
    (lambda: torch.set_float32_matmul_precision("medium"), "torch.get_float32_matmul_precision"),
])
def test_process_state_left_behind_is_caught(leak, name):
    saved = (torch.is_grad_enabled(), torch.get_default_dtype(), gc.isenabled(), torch.get_float32_matmul_precision())

    def candidate():
        leak()
        return X * 2

    try:
        message = _fails(candidate, lambda: X * 2, fact="process state", mode=None)
    finally:
        torch.set_grad_enabled(saved[0])
        torch.set_default_dtype(saved[1])
        torch.set_float32_matmul_precision(saved[3])
        if saved[2]:
            gc.enable()
    assert name in message


def test_a_forward_context_left_published_is_caught():
    from harness.batch import ForwardBatch, forward_context, published_batch

    batch = ForwardBatch.from_lengths([2], vocab_size=8, seed=0)
    left = forward_context(batch)

    def leaves_it_published():
        left.__enter__()  # entered, never exited: the next attention outside a forward reads this batch
        return X * 2

    try:
        message = _fails(leaves_it_published, lambda: X * 2, fact="process state")
    finally:
        left.__exit__(None, None, None)
    assert "published forward context" in message and published_batch() is None


def test_a_smoke_call_leaves_nothing_that_would_hide_the_same_change_later():
    saved = (torch.is_grad_enabled(), torch.get_default_dtype(), gc.isenabled())
    with process_state_kept():
        gc.disable()
        torch.set_grad_enabled(not saved[0])
        torch.set_default_dtype(torch.float64)
    assert (torch.is_grad_enabled(), torch.get_default_dtype(), gc.isenabled()) == saved


def test_module_state_left_behind_is_caught():
    model = torch.nn.Linear(3, 3)

    def writes_weight():
        out = model(X)
        model.weight.data[0, 0] += 1.0  # .data: no version bump, as a replayed kernel's write
        return out

    message = _fails(writes_weight, lambda: model(X), fact="module state", modules=[model], exact=False)
    assert "module 0 parameter weight values" in message

    def patches_forward():
        model.forward = model.forward
        return model(X)

    try:
        _fails(patches_forward, lambda: model(X), fact="module state", modules=[model])
    finally:
        del model.forward

    def replaces_hook_table():
        model._forward_hooks = type(model._forward_hooks)(model._forward_hooks)  # a handle removes from the old one
        return model(X)

    _fails(replaces_hook_table, lambda: model(X), fact="module state", modules=[model])
    _fails(lambda: model.eval()(X), lambda: model(X), fact="module state", modules=[model])


def test_an_input_written_is_caught_unless_eager_writes_it_too():
    source = X.clone()

    def writes():
        out = source[INDEX].clone()
        source[0, 0] = -1.0
        return out

    _fails(writes, lambda: source[INDEX], fact="input values", inputs=(source, INDEX))
    cache = torch.zeros(3)
    check_call("toy", lambda: cache.fill_(1).clone(), lambda: cache.fill_(1).clone(), inputs=(cache,), exact=True)


def test_random_state_must_advance_as_eager_advances_it():
    check_call("toy", lambda: torch.rand(3), lambda: torch.rand(3), exact=True)  # same stream: same numbers
    _fails(lambda: X * 2, lambda: X * 2 + 0 * torch.rand(1), fact="rng", inputs=())

    def reseeds():
        torch.manual_seed(0)
        return X * 2

    _fails(reseeds, lambda: X * 2, fact="rng", inputs=())


def test_a_result_changed_by_the_next_call_is_caught_and_the_table_can_allow_it(monkeypatch):
    static = torch.zeros(2, 3)

    def replay():
        static.copy_(torch.rand(2, 3))
        return static

    checker = Checker("toy")
    fresh = lambda: torch.rand(2, 3)  # noqa: E731
    checker.call(replay, fresh, exact=True)
    with pytest.raises(MismatchError, match="results outlive the next call"):
        checker.call(replay, fresh, exact=True)
    monkeypatch.setitem(ALLOWED, ("toy", "results outlive the next call"), "a test's own allowance")
    allowing = Checker("toy")
    allowing.call(replay, fresh, exact=True)
    allowing.call(replay, fresh, exact=True)


def test_keep_holds_the_results_of_several_earlier_calls():
    buffers = [torch.zeros(2, 3), torch.zeros(2, 3)]
    calls = 0

    def ping_pong():  # output buffers used in turn: a result survives the next call, not the one after
        nonlocal calls
        calls += 1
        return buffers[calls % 2].copy_(torch.rand(2, 3))

    fresh = lambda: torch.rand(2, 3)  # noqa: E731
    previous_only = Checker("toy")
    for _ in range(4):
        previous_only.call(ping_pong, fresh, exact=True)
    keeping = Checker("toy", keep=2)
    keeping.call(ping_pong, fresh, exact=True)
    keeping.call(ping_pong, fresh, exact=True)
    with pytest.raises(MismatchError, match="returned by the call 2 calls before this one changed"):
        keeping.call(ping_pong, fresh, exact=True)
    with pytest.raises(ValueError, match="keep=0"):
        Checker("toy", keep=0)


def test_twin_inputs_must_end_as_eager_leaves_its_twin():
    """A program that writes its own state runs on a twin (eager_inputs): each side writes its own copy."""
    def accumulate(cache):
        return lambda: cache.add_(1.0)

    def fails(candidate, eager, fact):
        mine, twin = torch.zeros(3), torch.zeros(3)
        with pytest.raises(MismatchError, match=fact):
            Checker("toy").call(candidate(mine), eager(twin), inputs=[mine], eager_inputs=[twin], exact=True)

    mine, twin = torch.zeros(3), torch.zeros(3)
    Checker("toy").call(accumulate(mine), accumulate(twin), inputs=[mine], eager_inputs=[twin], exact=True)
    assert torch.equal(mine, twin) and float(mine[0]) == 1.0
    fails(lambda t: lambda: (t.add_(1.0), t.add_(1.0))[1], accumulate, "input values")  # wrote twice
    fails(lambda t: t.clone, lambda t: lambda: t.add_(1.0).clone(), "input values")  # left as it was
    fails(lambda t: lambda: t.add_(1.0).clone(), accumulate, "output aliasing")  # a copy where eager returns its input


def test_construction_must_leave_the_model_as_it_was():
    model = torch.nn.Linear(3, 3)
    checker = Checker("toy")
    assert checker.construct(lambda: "built", modules=[model]) == "built"

    def hooks_the_model():
        return model.register_forward_hook(lambda *a: None)

    with pytest.raises(MismatchError, match="construction"):
        checker.construct(hooks_the_model, modules=[model])
    with pytest.raises(MismatchError, match="call: a call that raised"):  # any action that must leave them alone
        checker.construct(lambda: model.train(not model.training), modules=[model], what="a call that raised")


def test_a_failure_names_the_component_the_mode_and_the_callers_details():
    checker = Checker("gather", context=lambda **d: {"implementation": "gather=mine", **d})
    with pytest.raises(MismatchError) as failure:
        checker.call(lambda: X[:2], lambda: X[torch.tensor([0, 1])], inputs=(X,), exact=True, mode="no_grad",
                     seed=7)
    message = str(failure.value)
    assert message.startswith("gather: observably different from eager")
    assert "implementation: gather=mine" in message and "mode: no_grad" in message and "seed: 7" in message


def test_an_unknown_mode_is_one_line():
    with pytest.raises(ValueError, match="unknown calling mode 'train'"), calling_mode("train"):
        pass
