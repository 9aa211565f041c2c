"""Stand-in (harness .ci/gpu/extract-sglang) for the two-batch-overlap plugin: two-batch overlap is off, where the
real plugin's capture hook does nothing either."""


class TboCudaGraphRunnerPlugin:
    def capture_one_batch_size(self, forward_batch, num_tokens):
        return None
