"""Stand-in for an engine's breakable-graph runner: the code under test that ``adapters.py`` wraps.

It is the harness's reference runner behind an engine's own names (``capture_sizes``, ``capturer``,
``strict``, ``discovery_result``, ``forward_eager``, ``graph_stats``, ``last_capture_size``), so that
the adapter of docs/runner.md runs against ``suites/runner`` in the harness's tests. Not an example to
copy. Like the reference, it runs on tensor-parallel shards: the ranks agree on one capture size.
"""

from harness.errors import ReplayError
from harness.runner import LayerStackRunner


class _Runner(LayerStackRunner):
    last_capture_size = None

    def pad(self, batch, bucket):
        self.last_capture_size = bucket  # the group's bucket under tensor parallelism
        return super().pad(batch, bucket)


class BreakableGraphRunner:
    def __init__(self, model, *, capture_sizes, capturer, strict=False):
        self._runner = _Runner(model, buckets=capture_sizes, graphs=capturer, strict_discovery=strict)
        self.discovery_result = self._runner.discovery

    @property
    def last_capture_size(self):
        """The capture size the last replay ran at, as an engine's runner keeps its padded batch size."""
        return self._runner.last_capture_size

    def can_run(self, batch):
        return self._runner.can_run(batch)

    def replay(self, batch):
        return self._runner.replay(batch)

    def forward_eager(self, batch):
        if self._runner.in_replay:
            raise ReplayError("forward_eager inside a replay")
        return self._runner.run_eagerly(batch)

    def graph_stats(self):
        """``{capture size: (segments, breaks)}``."""
        return {int(size): (graph["segments"], graph["breaks"])
                for size, graph in self._runner.capture_plan()["graphs"].items()}
