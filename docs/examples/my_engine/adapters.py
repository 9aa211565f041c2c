# my_engine/adapters.py
import dataclasses

from harness.runner import select_bucket
from my_engine.graph_runner import BreakableGraphRunner  # the code under test


@dataclasses.dataclass
class Stats:
    captures: int = 0
    replays: int = 0
    eager_fallbacks: int = 0
    replays_by_bucket: dict = dataclasses.field(default_factory=dict)


class Adapter:
    def __init__(self, model, *, buckets, graphs, strict_discovery=False):
        buckets = tuple(buckets)  # any iterable, read once: a generator is empty the second time
        self.inner = BreakableGraphRunner(model, capture_sizes=list(buckets), capturer=graphs,
                                          strict=strict_discovery)
        self.buckets = tuple(sorted(buckets))
        self.discovery = self.inner.discovery_result        # needs .module, .path, .fell_back
        self.stats = Stats(captures=len(self.buckets))

    def bucket_for(self, num_tokens):
        return select_bucket(num_tokens, self.buckets)

    def can_run(self, batch):
        return self.inner.can_run(batch)

    def replay(self, batch):
        out = self.inner.replay(batch)
        # the bucket the engine replayed, not one worked out here from this batch's rows: under tensor
        # parallelism every rank pads to the largest rank's rows, which this rank's batch does not show
        bucket = self.inner.last_capture_size
        self.stats.replays += 1
        self.stats.replays_by_bucket[bucket] = self.stats.replays_by_bucket.get(bucket, 0) + 1
        return out

    def run(self, batch):
        if self.can_run(batch):
            return self.replay(batch)
        self.stats.eager_fallbacks += 1
        return self.inner.forward_eager(batch)

    def capture_plan(self):
        return {"graphs": {str(size): {"segments": segments, "breaks": breaks}
                           for size, (segments, breaks) in self.inner.graph_stats().items()}}


make_runner = Adapter
