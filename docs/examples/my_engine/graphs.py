# my_engine/graphs.py
from my_engine.graph_capture import EngineGraphs  # the code under test


class MyGraph:
    """The engine's captured graph under the harness's names."""

    def __init__(self, inner):
        self.inner = inner

    def replay(self):
        return self.inner.run()  # returns the output, refreshed in place

    @property
    def output(self):
        return self.inner.result

    @property
    def segment_count(self):
        return self.inner.num_segments

    @property
    def break_count(self):
        return self.inner.num_breaks

    @property
    def break_names(self):
        return self.inner.break_labels


class MyCapturer:
    """Adapts the engine's breakable-graph capture to the harness interface."""

    def __init__(self, backend):
        self.engine = EngineGraphs(backend)

    def new_pool(self):
        return self.engine.new_mempool()

    def capture(self, fn, *, pool=None, warmup_runs=1):
        return MyGraph(self.engine.record(fn, mempool=pool, warmup=warmup_runs))
