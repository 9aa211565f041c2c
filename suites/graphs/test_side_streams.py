"""Side streams around breaks: work a break queues on another stream is ordered before whatever reads it.

An eager region may prefetch on a stream of its own (weights, KV pages, a draft model's inputs) and leave the join
to the program after it: ``current_stream().wait_stream(side)`` at the top of the next segment. Inside a capture
that wait is on a stream that is not capturing. A capturer must either keep the ordering at replay or refuse the
capture; dropping the wait to let the capture through (TensorRT-LLM PR 16609's review, SGLang 0.5.23's wait-stream
hook) makes the segment read the prefetch buffer before the side stream wrote it. The race widener
(``harness.hazards.widened_races``, on by default) delays every side stream, so that early read happens every time.
"""

from __future__ import annotations

import pytest
import torch

from harness.errors import CaptureError
from harness.graphs import eager_on_graph

pytestmark = pytest.mark.clause("replay-equals-eager")

WIDTH = 1 << 14


@pytest.fixture(autouse=True)
def _cuda_only(graph_backend):
    if graph_backend.name != "cuda":
        pytest.skip("a side stream's late work exists only on CUDA; the emulated backend orders every stream op "
                    "at the call")


@pytest.mark.parametrize("replays", [1, 3])
def test_a_join_of_a_breaks_side_stream_is_kept_or_the_capture_refused(graph_oracle, make_tensor, replays):
    """A break prefetches ``x * 2`` into a buffer on its own stream and returns; the segment after it waits for that
    stream, then reads the buffer. Either the capture is refused (a ``CaptureError`` naming the problem), or every
    replay reads what the prefetch wrote, as eager does."""
    side = torch.cuda.Stream()
    x = make_tensor(WIDTH, seed=61)
    buffer = torch.zeros_like(x)

    @eager_on_graph
    def prefetch(source: torch.Tensor) -> None:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            buffer.copy_(source * 2)

    def program() -> torch.Tensor:
        prefetch(x)
        torch.cuda.current_stream().wait_stream(side)
        return buffer + 1

    def eager() -> torch.Tensor:
        out = program()
        buffer.zero_()  # eager runs first: the replay must read its own prefetch, not the one eager left
        return out

    try:
        graph = graph_oracle.capture(program, program="prefetch on a side stream, joined in the next segment")
    except CaptureError:
        return  # refused: the capturer cannot keep an order with a stream outside the capture, and says so
    for replay in range(replays):
        x.copy_(make_tensor(WIDTH, seed=62 + replay))
        graph_oracle.replay(graph, eager, inputs=[x], exact=True, replay=replay)
