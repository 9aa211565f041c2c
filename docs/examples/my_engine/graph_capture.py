"""Stand-in for an engine's breakable-graph capture: the code under test that ``graphs.py`` wraps.

It is the harness's reference capturer behind an engine's own names (``record``, ``new_mempool``,
``run``, ``result``, ``num_segments``, ...), so that the adapter of docs/graphs.md runs against
``suites/graphs`` in the harness's tests. Not an example to copy.
"""

from harness.graphs import GraphCapturer


class EngineGraph:
    def __init__(self, graph):
        self._graph = graph

    def run(self):
        return self._graph.replay()

    @property
    def result(self):
        return self._graph.output

    @property
    def num_segments(self):
        return self._graph.segment_count

    @property
    def num_breaks(self):
        return self._graph.break_count

    @property
    def break_labels(self):
        return self._graph.break_names


class EngineGraphs:
    def __init__(self, device_backend):
        self._capturer = GraphCapturer(device_backend)

    def new_mempool(self):
        return self._capturer.new_pool()

    def record(self, fn, *, mempool, warmup):
        return EngineGraph(self._capturer.capture(fn, pool=mempool, warmup_runs=warmup))
