"""Stand-in (harness .ci/gpu/extract-sglang) for sglang.srt.model_executor.runner_utils.forward_batch: the batch
eager regions of prefill graphs read when they run ("Eager callbacks resolve the batch when executed instead of
retaining capture-time request metadata", its docstring). SGLang's attention breaks read it with
get_forward_batch; the zoo's read the harness's forward context, so set_forward_batch publishes the batch in both
(SGLang's own code, plus harness.batch.forward_context)."""

from contextlib import contextmanager
from contextvars import ContextVar

from sglang_standin import reached

from harness.batch import forward_context

_current_batch = ContextVar("forward_batch", default=None)
_NAME = ("sglang.srt.model_executor.runner_utils.forward_batch.set_forward_batch (publishes the batch to the zoo's "
         "attention as the harness's forward context too)")


def get_forward_batch():
    batch = _current_batch.get()
    if batch is None:
        raise RuntimeError("No forward batch is set for this execution")
    return batch


@contextmanager
def set_forward_batch(forward_batch):
    """Publish the current batch and restore the previous one on scope exit."""
    reached(_NAME)
    reset_token = _current_batch.set(forward_batch)
    try:
        with forward_context(forward_batch):
            yield
    finally:
        _current_batch.reset(reset_token)
