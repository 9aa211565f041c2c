"""Stand-in (harness .ci/gpu/extract-sglang) for TorchMemorySaverAdapter: memory-saver mode is off, so its
adapter is the disabled one."""


class TorchMemorySaverAdapter:
    enabled = False

    @staticmethod
    def create(enable):
        return TorchMemorySaverAdapter()
