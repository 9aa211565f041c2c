"""The public break seam: any capturer receives the harness's break calls through receive_breaks."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest
import torch

from harness.compare import assert_equivalent
from harness.graphs import (
    INLINE_BREAKS,
    BreakReceiver,
    GraphCapturer,
    break_graph,
    current_break_receiver,
    eager_on_graph,
    get_backend,
    is_capturing,
    receive_breaks,
    write_back,
)

ROOT = Path(__file__).resolve().parent.parent


@eager_on_graph
def attention(hidden: torch.Tensor, *, scale: float) -> torch.Tensor:
    return hidden * scale


class Recorder:
    """A receiver that records each call and runs the body once, as an engine's marker would."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def run_break(self, fn, args, kwargs):
        self.calls.append((fn.__qualname__, args, kwargs))
        with receive_breaks(INLINE_BREAKS):
            return fn(*args, **kwargs)


def test_a_receiver_gets_every_marked_call_with_its_arguments_and_returns_its_result():
    hidden = torch.arange(4.0)
    recorder = Recorder()
    with receive_breaks(recorder) as active:
        assert active is recorder and current_break_receiver() is recorder and is_capturing()
        out = attention(hidden, scale=2.0)
        break_graph()
    assert [name for name, _, _ in recorder.calls] == ["attention", "_empty_break"]
    name, args, kwargs = recorder.calls[0]
    assert args[0] is hidden and kwargs == {"scale": 2.0}, "the receiver must get the caller's own objects"
    assert_equivalent(out, hidden * 2.0, exact=True)
    assert current_break_receiver() is None and not is_capturing()


def test_outside_a_receiver_and_inside_a_break_body_a_break_is_a_plain_call():
    assert_equivalent(attention(torch.ones(2), scale=3.0), torch.full((2,), 3.0), exact=True)
    with receive_breaks(INLINE_BREAKS):
        assert not is_capturing() and current_break_receiver() is INLINE_BREAKS
        assert_equivalent(attention(torch.ones(2), scale=3.0), torch.full((2,), 3.0), exact=True)


def test_the_receiver_is_restored_after_an_exception_and_nesting():
    outer, inner = Recorder(), Recorder()
    with pytest.raises(ValueError), receive_breaks(outer):
        with receive_breaks(inner):
            attention(torch.ones(1), scale=1.0)
            assert current_break_receiver() is inner
        assert current_break_receiver() is outer
        raise ValueError("boom")
    assert current_break_receiver() is None
    assert len(inner.calls) == 1 and outer.calls == []


def test_a_receiver_without_run_break_is_refused():
    with pytest.raises(TypeError, match="run_break"), receive_breaks(object()):  # type: ignore[arg-type]
        pass


def test_the_receiver_is_per_thread():
    recorder, seen = Recorder(), []
    with receive_breaks(recorder):
        thread = threading.Thread(target=lambda: seen.append((current_break_receiver(), attention(torch.ones(1),
                                                                                                   scale=2.0))))
        thread.start()
        thread.join()
    assert seen[0][0] is None and recorder.calls == [], "another thread's break reached this thread's receiver"


def test_the_reference_receives_its_breaks_through_the_seam():
    """The reference's capture session is the receiver during capture, INLINE_BREAKS inside a break body."""
    observed: list = []

    @eager_on_graph
    def probe(hidden):
        observed.append(current_break_receiver())
        return hidden + 1

    static = torch.arange(3.0)

    def program():
        observed.append(current_break_receiver())
        return probe(static * 2) * 3

    graph = GraphCapturer(get_backend("emulated")).capture(program, warmup_runs=0)
    session, inside = observed
    assert isinstance(session, BreakReceiver) and type(session).__name__ == "CaptureSession"
    assert inside is INLINE_BREAKS
    static.copy_(torch.tensor([5.0, 6.0, 7.0]))
    assert_equivalent(graph.replay(), (static * 2 + 1) * 3, exact=True)


class ToyEngineCapturer:
    """A capturer built only from the public API, as an engine adapter would be: breaks arrive through
    receive_breaks, segments come from the backend's public seams, outputs merge with write_back."""

    def __init__(self, backend):
        self.backend = backend

    def new_pool(self):
        return self.backend.new_pool()

    def capture(self, fn, *, pool=None, warmup_runs=1):
        for _ in range(warmup_runs):
            self.backend.warm_up(fn)
        capturer = self
        steps: list = []
        pool = self.new_pool() if pool is None else pool

        class Receiver:
            recording = None

            def run_break(self, body, args, kwargs):
                steps.append(self.recording.end())
                with receive_breaks(INLINE_BREAKS):
                    output = body(*args, **kwargs)
                steps.append([body, args, kwargs, output])
                self.recording = capturer.backend.begin_segment(pool)
                return output

        receiver = Receiver()
        with self.backend.capture_context(), receive_breaks(receiver):
            receiver.recording = self.backend.begin_segment(pool)
            output = fn()
            steps.append(receiver.recording.end())

        class Graph:
            def __init__(self):
                self.output = output
                self.break_names = [step[0].__qualname__ for step in steps if isinstance(step, list)]
                self.break_count = len(self.break_names)
                self.segment_count = len(steps) - self.break_count

            def replay(self):
                for step in steps:
                    if isinstance(step, list):
                        step[3] = write_back(step[3], step[0](*step[1], **step[2]))
                    else:
                        step.replay()
                return self.output

        return Graph()


def test_a_capturer_built_on_the_public_seam_alone_captures_and_replays():
    from harness import impls

    impls.validate("graphs", ToyEngineCapturer, "graphs=tests.ToyEngineCapturer")  # the smoke capture and replay
    capturer = ToyEngineCapturer(get_backend("emulated"))
    hidden = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    live = {"scale": 2.0}

    @eager_on_graph
    def attention_like(h):
        return h * live["scale"]

    def program():
        return attention_like(torch.tanh(hidden)) + 1

    graph = capturer.capture(program)
    assert (graph.segment_count, graph.break_count) == (2, 1)
    hidden.copy_(torch.randn(4, 3, generator=torch.Generator().manual_seed(2)))
    live["scale"] = 5.0
    assert_equivalent(graph.replay(), torch.tanh(hidden) * 5.0 + 1, exact=True)


def test_the_adapters_reach_no_private_name_of_the_harness():
    """An engine adapter uses the public seam (receive_breaks), never the graphs package's private state."""
    offenders = []
    for path in (ROOT / "harness" / "adapters").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness") and "._" in node.module:
                offenders.append(f"{path.name}: from {node.module} import ...")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness"):
                offenders += [f"{path.name}: imports {alias.name}" for alias in node.names
                              if alias.name.startswith("_")]
    assert not offenders, f"adapters reach private names: {offenders}"
