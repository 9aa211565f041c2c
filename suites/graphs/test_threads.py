"""Concurrent callers (docs/graphs.md): what the contract promises to several threads, and nothing more.

Each thread has its own oracle (its own checker), so every replay is compared with its own program run eagerly in
that thread. The overlap is forced, not hoped for: a :class:`~harness.oracle.concurrency.Rendezvous` inside a break or
inside the captured function holds each thread there until the others have arrived. Graphs are captured one at a
time (the contract asks the caller to serialise captures), and each graph has its own pool and static tensors."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from harness.graphs import eager_on_graph, is_capturing
from harness.oracle.concurrency import Rendezvous, run_in_threads
from harness.plugin.profiles import capped_examples

pytestmark = pytest.mark.clause("per-thread")


def _attention_program(x, meta, rendezvous):
    """A layer-like program whose break (between two segments) reads live metadata, returns a new tensor that
    later segments read, and waits at ``rendezvous``: armed, both threads are inside a break at once."""

    @eager_on_graph
    def attend(h, meta):
        rendezvous.wait()
        return h.flip(0) * meta["scale"] + meta["step"]

    def program():
        h = x * 3
        return {"out": attend(h, meta) - 1, "h": h}

    return program


def _refill(x, meta, make_tensor, *, seed):
    x.copy_(make_tensor(*x.shape, seed=seed))
    meta["scale"].copy_(make_tensor(1, seed=seed + 1))
    meta["step"] = seed  # a Python value the break reads live


_MAX_THREADS = 8


@example(threads=2).via("the pair every engine has: scheduler and forward")
@example(threads=3).via("one more than a pair")
@example(threads=_MAX_THREADS).via("the most callers drawn")
@capped_examples(2)
@given(threads=st.one_of(st.sampled_from([1, 3, _MAX_THREADS]), st.integers(1, _MAX_THREADS)))
def test_graphs_replay_from_threads_at_once(graph_oracle, make_tensor, threads):
    """Different graphs (own pools, own static tensors) replayed from a drawn number of threads (1 to 8) at once,
    all inside a break together, each equal their own eager run, replay after replay, and each graph still
    replays alone afterwards."""
    names = [f"thread {i + 1} of {threads}" for i in range(threads)]
    rendezvous = Rendezvous(threads)
    oracles = [graph_oracle.fresh() for _ in names]
    worlds = [(make_tensor(4, 3, seed=20 + 2 * i), {"scale": make_tensor(1, seed=21 + 2 * i), "step": 0})
              for i in range(threads)]
    programs = [_attention_program(x, meta, rendezvous) for x, meta in worlds]
    graphs = [oracle.capture(program) for oracle, program in zip(oracles, programs)]
    outputs = [graph.output for graph in graphs]

    def replays(i):
        x, meta = worlds[i]

        def body():
            for step in range(3):
                _refill(x, meta, make_tensor, seed=100 * (i + 1) + 10 * step)
                oracles[i].replay(graphs[i], programs[i], inputs=[x, meta["scale"]], thread=names[i],
                                  threads=threads, replay=step)

        return body

    with rendezvous.armed():
        run_in_threads([replays(i) for i in range(threads)], rendezvous=rendezvous, names=names)
    for i, (oracle, graph, (x, meta)) in enumerate(zip(oracles, graphs, worlds)):
        assert graph.output is outputs[i], "a replay must refresh graph.output in place, from any thread"
        assert (graph.segment_count, graph.break_count) == (2, 1), (graph.segment_count, graph.break_count)
        _refill(x, meta, make_tensor, seed=900 + i)
        oracle.replay(graph, programs[i], inputs=[x, meta["scale"]], thread=names[i], after="every thread ended")


def _replaying_program(x, *, seen, rendezvous):
    """The replaying thread's program: two breaks, each a meeting point at replay (armed) around a segment, so that
    its replay can be held open while the other thread captures. The first break notes whether this thread sees a
    capture and, while the threads meet, calls a marked helper (a plain call outside any capture); at capture and
    in the eager twin it does the helper's work itself, so that the capture holds no break inside a break body
    (a clause of its own, ``nested-breaks-inline``, which an engine may break without breaking this one)."""

    @eager_on_graph
    def double(h):
        return h * 2

    @eager_on_graph
    def normalise(h):
        rendezvous.wait()  # X: this replay's checks are behind it; the other thread may begin its capture
        rendezvous.wait()  # Y: the other thread is inside its capture, mid-segment, until Z
        seen["capturing in the replaying thread"] = is_capturing()
        if seen["capturing in the replaying thread"]:
            raise AssertionError("is_capturing() is true in a thread that only replays, while another thread "
                                 "captures: capture state must be per thread")
        return (double(h) if rendezvous.is_armed else h * 2) / (h.abs().sum() + 1)

    @eager_on_graph
    def shift(h):
        out = h.flip(0) + 1
        rendezvous.wait()  # Z: this thread's work inside the other's capture is done
        rendezvous.wait()  # W: the other thread's capture has ended; this replay ends, and is checked, after it
        return out

    return lambda: shift(normalise(x * 3) - 1) * 2


def test_a_thread_replays_while_another_captures(graph_oracle, make_tensor):
    """One thread replays its graph while another captures (held open mid-segment): the replay equals eager, a
    break it calls stays a plain call there, none of its work lands in the capture (the new graph holds its own
    break only and replays without touching the other thread's tensors), and both graphs replay alone after.

    Only the middle of the replay (a write-back, a segment, a break's eager work) runs inside the other thread's
    capture, and its checks (which read values back to the host) run before and after: on CUDA a capture in the
    global capture mode, the reference's, refuses host synchronisations from every thread (docs/graphs.md)."""
    rendezvous = Rendezvous()
    capturing, replaying = graph_oracle.fresh(), graph_oracle.fresh()
    seen = {}
    xb = make_tensor(5, 2, seed=30)
    graph_b = replaying.capture(_replaying_program(xb, seen=seen, rendezvous=rendezvous))
    twin_b = _replaying_program(xb, seen={}, rendezvous=Rendezvous())  # eager twin: never waits
    seen.clear()

    xa = make_tensor(4, 3, seed=31)

    @eager_on_graph
    def attend(h):
        return h.flip(0) - 1

    def program_a():
        h = xa * 3
        if is_capturing():  # the recording run only: replays and the eager twin never wait
            seen["capturing in the capturing thread"] = True
            rendezvous.wait()  # Y
            rendezvous.wait()  # Z
        return attend(h) * 2

    def capture_a():
        rendezvous.wait()  # X
        graph = capturing.capture(program_a)
        rendezvous.wait()  # W
        return graph

    def replay_b():
        xb.copy_(make_tensor(5, 2, seed=40))
        replaying.replay(graph_b, twin_b, inputs=[xb], during="another thread's capture")

    with rendezvous.armed():
        graph_a, _ = run_in_threads([capture_a, replay_b], rendezvous=rendezvous,
                                    names=("capturing thread", "replaying thread"))
    assert seen == {"capturing in the capturing thread": True, "capturing in the replaying thread": False}, seen
    assert list(graph_a.break_names) == [attend.__qualname__] and graph_a.segment_count == 2, (
        f"the capture holds {list(graph_a.break_names)} in {graph_a.segment_count} segments: another thread's "
        "breaks or work were recorded into it")
    b_before = (xb.clone(), graph_b.output.clone())
    xa.copy_(make_tensor(4, 3, seed=50))
    capturing.replay(graph_a, program_a, inputs=[xa], after="the capture overlapped another thread's replay")
    assert xb.equal(b_before[0]) and graph_b.output.equal(b_before[1]), (
        "replaying the new graph changed the other thread's tensors: its work was recorded into the capture")
    xb.copy_(make_tensor(5, 2, seed=51))
    replaying.replay(graph_b, twin_b, inputs=[xb], after="the other thread's capture ended")
