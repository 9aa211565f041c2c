"""Stand-in (harness .ci/gpu/extract-sglang) for graph_capture of sglang.srt.distributed.parallel_state (the
real module sets up the engine's process groups). On one GPU SGLang's graph_capture makes the capture stream wait
for the current one and makes it current; no custom all-reduce takes part. That is what this one does."""

from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass
class GraphCaptureContext:
    stream: torch.cuda.Stream


@contextmanager
def graph_capture(stream=None):
    stream = torch.cuda.Stream() if stream is None else stream
    current = torch.cuda.current_stream()
    if current != stream:
        stream.wait_stream(current)
    with torch.cuda.stream(stream):
        yield GraphCaptureContext(stream)
