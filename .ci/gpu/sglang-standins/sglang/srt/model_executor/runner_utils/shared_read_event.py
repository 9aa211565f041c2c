"""Stand-in (harness .ci/gpu/extract-sglang): publishing the shared KV tables' read-done event matters only where
an attention backend shares them across streams (the stand-in backend returns no read ends)."""


def maybe_publish_prefill_shared_read_done(model_runner, shared_read_ends, device_module):
    return None
