"""Illegal ops fail the capture; failed and nested captures leave nothing behind."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from harness.compare import assert_equivalent
from harness.errors import CaptureError
from harness.graphs import eager_on_graph, is_capturing
from harness.oracle import CALLING_MODES, example_caller_context, footprint, process_state

pytestmark = pytest.mark.clause("capture-rules")

HOST_SYNC_PROGRAMS = {
    "item": lambda x: x * x.sum().item(),
    "bool": lambda x: x * 2 if bool(x.sum() > 0) else x,
    "nonzero": lambda x: torch.nonzero(x > 0).float().sum() + x,
    "masked_select": lambda x: torch.masked_select(x, x > 0).sum() + x,
    "unique": lambda x: torch.unique(x.round()).sum() + x,
    "boolean_mask_index": lambda x: x[x > 0].sum() + x,
}


def _assert_capture_usable_afterwards(graph_oracle, make_tensor):
    assert not is_capturing(), "a failed capture left a capture active"
    x = make_tensor(4, seed=99)
    graph = graph_oracle.capture(lambda: x * 2, after="a failed capture")
    x.copy_(make_tensor(4, seed=100))
    graph_oracle.replay(graph, lambda: x * 2, inputs=[x], exact=True, after="a failed capture")


@pytest.mark.parametrize("program", sorted(HOST_SYNC_PROGRAMS))
def test_host_sync_or_data_dependent_op_fails_capture(graph_oracle, make_tensor, program):
    x = make_tensor(16, seed=1)
    HOST_SYNC_PROGRAMS[program](x)  # eager is fine
    graph_oracle.capture_fails(lambda: HOST_SYNC_PROGRAMS[program](x), CaptureError, program=program)
    _assert_capture_usable_afterwards(graph_oracle, make_tensor)


def test_a_device_side_assert_is_captured_and_replayed(graph_oracle, make_tensor):
    # torch._assert_async checks on the device, without the host: CUDA captures it (engines use it for
    # bounds checks inside graphs), so a capturer must not refuse it as it refuses a host sync.
    x = make_tensor(16, seed=4)

    def program():
        torch._assert_async((x == x).any())  # true for any finite values
        return x * 2

    graph = graph_oracle.capture(program)
    x.copy_(make_tensor(16, seed=5))
    graph_oracle.replay(graph, program, inputs=[x], exact=True)


def test_copy_to_host_fails_capture(graph_oracle, make_tensor, device):
    if device.type == "cpu":
        pytest.skip("tensors already live on the host: there is no device-to-host copy to refuse")
    x = make_tensor(8, seed=2)
    graph_oracle.capture_fails(lambda: x.cpu() * 2, CaptureError)
    _assert_capture_usable_afterwards(graph_oracle, make_tensor)


def test_emulated_error_names_the_op(graph_oracle, graph_backend, make_tensor):
    if graph_backend.name != "emulated":
        pytest.skip("CUDA reports a generic capture error without the op's name")
    x = make_tensor(4, seed=3)
    graph_oracle.capture_fails(lambda: torch.nonzero(x), CaptureError, match="nonzero")


# Tensors made from Python data on the graph's device: a copy from pageable host memory, which CUDA refuses in capture.
PYTHON_DATA_TENSORS = {
    "tensor": lambda x: x * torch.tensor(2.0, device=x.device),
    "as_tensor": lambda x: x + torch.as_tensor([1.0] * x.shape[-1], device=x.device),
}


@pytest.mark.parametrize("made_by", sorted(PYTHON_DATA_TENSORS))
def test_tensor_made_from_python_data_fails_capture(graph_oracle, graph_backend, make_tensor, made_by):
    """``torch.tensor``/``torch.as_tensor`` on the graph's device inside a capture fails it with ``CaptureError``
    (``docs/graphs.md``, Graph backends); the emulated backend's error names the line that made the tensor, the
    program's own (not torch's or the harness's), so the user knows what to move out of the capture."""
    x = make_tensor(4, seed=5)
    emulated = graph_backend.name == "emulated"
    graph_oracle.capture_fails(lambda: PYTHON_DATA_TENSORS[made_by](x), CaptureError, made_by=made_by,
                               match=r"test_capture_errors\.py:\d+ \(<lambda>: " if emulated else None)
    _assert_capture_usable_afterwards(graph_oracle, make_tensor)


class _Interrupt(BaseException):
    pass


@pytest.mark.clause("capture-failure-clean")
@pytest.mark.parametrize("error_type", [ValueError, _Interrupt])
@pytest.mark.parametrize("where", ["segment", "break"])
def test_exception_during_capture_propagates_and_leaves_no_state(graph_oracle, make_tensor, error_type, where):
    x = make_tensor(4, seed=4)

    @eager_on_graph
    def failing_break(h):
        raise error_type("boom")

    def fn():
        h = x + 1
        if where == "break":
            return failing_break(h)
        raise error_type("boom")

    graph_oracle.capture_fails(fn, error_type, match="boom", where=where)
    _assert_capture_usable_afterwards(graph_oracle, make_tensor)


@pytest.mark.clause("not-reentrant")
def test_nested_capture_raises(graph_oracle, make_tensor):
    x = make_tensor(4, seed=5)

    def outer():
        graph_oracle.capturer.capture(lambda: x * 2)
        return x + 1

    graph_oracle.capture_fails(outer, CaptureError, match="re-entrant")
    _assert_capture_usable_afterwards(graph_oracle, make_tensor)


@pytest.mark.clause("not-reentrant")
def test_capture_inside_a_break_body_raises(graph_oracle, make_tensor):
    x = make_tensor(4, seed=6)

    @eager_on_graph
    def sneaky(h):
        graph_oracle.capturer.capture(lambda: h * 2)
        return h

    graph_oracle.capture_fails(lambda: sneaky(x + 1), CaptureError, match="re-entrant")
    _assert_capture_usable_afterwards(graph_oracle, make_tensor)


# --- what a failed capture must give back, on every exit path -------------------------------------------


def _process_state(device: torch.device) -> dict[str, object]:
    """The process-wide state a capture may change while it runs and must restore however it ends: every setting
    and mode the checker compares (:func:`harness.oracle.process_state`, found by introspection), and what only a
    capture touches: Dynamo's configuration, the dispatch-mode stack, the patched Tensor.tolist, the stream's
    capture status."""
    state: dict[str, object] = {
        **process_state(),
        "dynamo config": torch._dynamo.config.get_config_copy(),
        "dispatch modes active": len(_get_current_dispatch_mode_stack()),
        "Tensor.tolist": torch.Tensor.tolist,
    }
    if device.type == "cuda":
        state["stream capturing"] = torch.cuda.is_current_stream_capturing()
    return state


def _fails_in_a_segment(x):
    return (x + 1) * (x > 0).nonzero().sum()


def _fails_in_a_break(x):
    return _raising_break(x + 1) * 2


@eager_on_graph
def _raising_break(h):
    raise ValueError("a break fails during capture")


def _fails_after_a_break(x):
    # a segment and a break recorded before the failure: what a session that outlives its failure would keep
    h = _doubling_break(x + 1)
    return (h > 0).nonzero().sum() * h


@eager_on_graph
def _doubling_break(h):
    return h * 2


def _interrupted(x):
    raise _Interrupt("interrupted during capture")


FAILED_CAPTURES = {
    "host_sync_in_a_segment": (_fails_in_a_segment, CaptureError),
    "host_sync_after_a_break": (_fails_after_a_break, CaptureError),
    "exception_in_a_break": (_fails_in_a_break, ValueError),
    "base_exception_in_a_segment": (_interrupted, _Interrupt),
}


@pytest.mark.clause("capture-failure-clean")
@pytest.mark.parametrize("how", sorted(FAILED_CAPTURES))
def test_failed_capture_restores_compile_stance_dynamo_and_allocator_state(graph_oracle, make_tensor, device,
                                                                            failure_context, how):
    """After a capture that failed part-way, compiled functions compile and run compiled again, and
    the dispatch-mode stack, grad mode, patched methods, the garbage collector and (on CUDA) the
    current stream and its capture status are as before the capture."""
    from torch._dynamo.testing import CompileCounter

    program, error = FAILED_CAPTURES[how]
    x = make_tensor(6, seed=7)
    before = _process_state(device)
    graph_oracle.capture_fails(lambda: program(x), error, how=how)
    after = _process_state(device)
    changed = {name: (before[name], after[name]) for name in before if after[name] != before[name]}
    assert not changed, f"a failed capture left process state changed (before, after): {changed} " \
                        f"{failure_context(how=how)}"
    torch._dynamo.reset()
    counter = CompileCounter()

    @torch.compile(backend=counter, dynamic=False)
    def double(t):
        return t * 2

    assert_equivalent(double(x), x * 2, exact=True)
    assert counter.frame_count == 1, (
        f"after a failed capture ({how}) a compiled function compiled {counter.frame_count} frames instead of 1: the "
        "capture left a compile stance (force_eager, eager_on_recompile) or a Dynamo setting behind"
    )
    torch._dynamo.reset()
    _assert_capture_usable_afterwards(graph_oracle, make_tensor)


@pytest.mark.clause("capture-failure-clean")
# a failure in a break (at the warm-up on CUDA) and one in a segment after a segment and a break were recorded: the
# two ways a capture fails with something allocated (the others fail before anything is)
@pytest.mark.parametrize("how", ["exception_in_a_break", "host_sync_after_a_break"])
def test_a_failed_capture_keeps_no_memory(graph_oracle, make_tensor, how):
    """PyTorch #188439: a capture aborted by an error must release what it allocated (its pool's blocks, the
    tensors of its segments). The first failure may create what any capture creates once (a lazily made handle);
    each later one must leave the process holding what it held before: the tensors, their bytes and the device
    allocator's bytes, after collecting."""
    program, error = FAILED_CAPTURES[how]
    x = make_tensor(1 << 12, seed=8)
    graph_oracle.capture_fails(lambda: program(x), error, how=how)
    before = footprint()
    for attempt in range(2):
        graph_oracle.capture_fails(lambda: program(x), error, how=how, attempt=attempt)
    kept = footprint() - before
    assert (kept.tensors, kept.tensor_bytes, kept.device_bytes) == (0, 0, 0), (
        f"two more failed captures ({how}) left the process holding {kept.tensors} more tensors, "
        f"{kept.tensor_bytes} more bytes of tensor storage and {kept.device_bytes} more device bytes: a failed "
        "capture keeps what it allocated")


@contextlib.contextmanager
def _process_settings(*, collector: bool, precision: str, default_dtype: torch.dtype) -> Iterator[None]:
    """The caller's process settings for one example, given back afterwards."""
    saved = (gc.isenabled(), torch.get_float32_matmul_precision(), torch.get_default_dtype())
    (gc.enable if collector else gc.disable)()
    torch.set_float32_matmul_precision(precision)
    torch.set_default_dtype(default_dtype)
    try:
        yield
    finally:
        (gc.enable if saved[0] else gc.disable)()
        torch.set_float32_matmul_precision(saved[1])
        torch.set_default_dtype(saved[2])


@pytest.mark.clause("capture-failure-clean")
@given(mode=st.sampled_from(CALLING_MODES), collector=st.booleans(),
       precision=st.sampled_from(["highest", "high", "medium"]),
       default_dtype=st.sampled_from([torch.float32, torch.float64]))
def test_successful_capture_restores_process_state(graph_oracle, make_tensor, device, mode, collector, precision,
                                                   default_dtype):
    """A capture that succeeds gives back what it changed too: an engine captures under no_grad or with
    the collector off, and a capture that restored them only on failure would leave the rest of the
    process (the eager path, a training step, the collector) changed. The caller's settings are drawn:
    a capturer that sets one to a fixed value (TF32 matmuls, a default dtype, the collector off) and never
    gives it back is seen only from a caller whose setting was another, whatever earlier captures of this
    process (the implementation's load-time smoke capture among them) left behind."""
    oracle = graph_oracle.fresh()
    x = make_tensor(6, seed=8)

    @eager_on_graph
    def attend(h):
        return h * 3

    program = lambda: attend(x + 1) - 1  # noqa: E731
    # The example's held caller's context first, the drawn settings inside it: the two nest, and each is put back
    # in its turn (entered inside, the held context would put back at the example's end the settings drawn here).
    example_caller_context("graphs")
    with _process_settings(collector=collector, precision=precision, default_dtype=default_dtype):
        before = _process_state(device)
        graph = oracle.capture(program, mode=mode)
        after_capture = _process_state(device)
        oracle.replay(graph, program, inputs=[x], mode=mode)
        after_replay = _process_state(device)
    for when, after in (("capture", after_capture), ("replay", after_replay)):
        changed = {name: (before[name], after[name]) for name in before if after[name] != before[name]}
        assert not changed, f"a successful {when} left process state changed (before, after): {changed}"
