"""Stand-in (harness .ci/gpu/extract-sglang) for PrefillInputBuffers of sglang.srt.model_executor.runner_utils.buffers:
the static prefill input tensors, which the runner hands to its buffer registry (the stand-in registry allocates
the ones the zoo's models read itself). Without pipeline parallelism it has no proxy tensors."""


class PrefillInputBuffers:
    pp_proxy_tensors = None

    @classmethod
    def create(cls, **options):
        buffers = cls()
        buffers.options = options
        return buffers

    def share_buffers(self):
        return None
