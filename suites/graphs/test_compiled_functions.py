"""``torch.compile``d functions inside a capture: replayed correctly, and still compiled afterwards."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from harness.compare import assert_equivalent

pytestmark = pytest.mark.clause("replay-equals-eager")


def test_compiled_function_replays_and_still_compiles_after_capture(graph_oracle, make_tensor):
    torch._dynamo.reset()
    counter = CompileCounter()  # counts Dynamo frames and runs the traced graph without inductor

    @torch.compile(backend=counter, dynamic=True)
    def gather_scaled(buffer, indices):
        return buffer[indices] * 2

    buffer, indices = make_tensor(10, 3, seed=1), torch.tensor([4, 1, 1], device=make_tensor(1, seed=0).device)
    graph = graph_oracle.capture(lambda: gather_scaled(buffer, indices))
    buffer.copy_(make_tensor(10, 3, seed=2))
    indices.copy_(torch.tensor([0, 9, 3]))
    # the eager twin is the function's body: calling the compiled function here would compile it before the check
    graph_oracle.replay(graph, lambda: buffer[indices] * 2, inputs=[buffer, indices])
    frames_before = counter.frame_count
    assert_equivalent(gather_scaled(buffer, indices[:2]), buffer[indices[:2]] * 2, exact=True)
    assert counter.frame_count + frames_before >= 1, (
        "the compiled function never compiled: a capture left Dynamo skipping it, so it silently runs eagerly"
    )
    assert counter.frame_count >= 1
    torch._dynamo.reset()


@pytest.mark.parametrize("autocast", [False, True], ids=["autocast-off", "autocast-on"])
def test_a_capture_at_serving_time_compiles_nothing(graph_oracle, make_tensor, device, autocast):
    """vLLM #57227: an engine that captures a bucket at serving time, after its compiled functions have run, must not
    compile inside the capture (a Triton JIT or an Inductor compile there is a host stall, or a capture failure). The
    compiled function here has run once for the bucket's shapes, in the caller's context; a capturer whose warm-up or
    capture changes what Dynamo guards on (autocast's cast cache, grad mode, a stance) compiles it again."""
    torch._dynamo.reset()
    counter = CompileCounter()

    @torch.compile(backend=counter, dynamic=True)
    def scaled_sum(buffer, weight):
        return (buffer @ weight).sum(dim=0) * 2

    buffer, weight = make_tensor(12, 8, seed=3), make_tensor(8, 8, seed=4)
    context = torch.autocast(device.type, dtype=torch.bfloat16) if autocast else torch.autocast(device.type,
                                                                                                   enabled=False)
    with context:
        scaled_sum(buffer, weight)  # serving: compiled for these shapes in this context
        served = counter.frame_count
        graph = graph_oracle.capture(lambda: scaled_sum(buffer, weight), autocast=autocast)
    assert served >= 1, "the compiled function never compiled when served"
    assert counter.frame_count == served, (
        f"capturing a function already compiled for its shapes compiled {counter.frame_count - served} more frames: "
        "the capture changed something Dynamo guards on")
    del graph
    torch._dynamo.reset()
