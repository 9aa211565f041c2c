"""Mutants of the ``runner`` component: each is the reference runner with one real bug.

Each overrides exactly one seam of :class:`~harness.runner.LayerStackRunner`, so the suites see
the reference everywhere else. ``python -m harness selfcheck --component runner`` requires every
one to fail ``pytest suites/runner``.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import warnings
from typing import Any, Callable, Iterator

from torch import nn

from harness import impls
from harness.errors import BucketError
from harness.runner.batch import ForwardBatch, HiddenMode
from harness.runner.discovery import DiscoveryResult
from harness.runner.runner import LayerStackRunner, StaticInputs

__all__: list[str] = []  # mutants are reached through the registry, never imported by name


class ForgetsToRestoreForward(LayerStackRunner):
    @contextlib.contextmanager
    def patched_forward(self, replacement: Callable[..., Any]) -> Iterator[None]:
        self.layer_model.forward = replacement
        yield


class RestoresOnlyOnSuccess(LayerStackRunner):
    @contextlib.contextmanager
    def patched_forward(self, replacement: Callable[..., Any]) -> Iterator[None]:
        original = self.layer_model.__dict__.get("forward")
        self.layer_model.forward = replacement
        yield  # no try/finally: an exception in the outer forward leaves the patch in place
        if original is None:
            del self.layer_model.forward
        else:
            self.layer_model.forward = original


class RestoresOnlyOnException(LayerStackRunner):
    @contextlib.contextmanager
    def patched_forward(self, replacement: Callable[..., Any]) -> Iterator[None]:
        original = self.layer_model.__dict__.get("forward")

        def restore() -> None:
            if original is None:
                del self.layer_model.forward
            else:
                self.layer_model.forward = original

        self.layer_model.forward = replacement
        try:
            yield
        except Exception:  # a KeyboardInterrupt (BaseException) skips this and leaves the patch
            restore()
            raise
        restore()


class NoGradModeSwitch(LayerStackRunner):
    def autograd_off(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class CapturesWholeModel(LayerStackRunner):
    def discover(self, model: nn.Module) -> DiscoveryResult:
        # Logits processing inside the graph, yet not marked as a fallback: multi-request batches replay.
        return DiscoveryResult(model, "", False, "whole-model", ())


class BucketOffByOne(LayerStackRunner):
    def bucket_for(self, num_tokens: int) -> int:
        index = bisect.bisect_right(self.buckets, num_tokens)  # a batch exactly a bucket's size skips it
        if index == len(self.buckets):
            raise BucketError(f"a batch of {num_tokens} tokens fits no bucket (buckets {list(self.buckets)})")
        return self.buckets[index]


class _StalePositions(StaticInputs):
    def load(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, copy_batch: bool) -> None:
        # Positions (argument 1) keep whatever the capture or the previous replay left there.
        super().load((args[0], self.args[1], *args[2:]), kwargs, copy_batch=copy_batch)


class StalePositions(LayerStackRunner):
    static_inputs_class = _StalePositions


class _DropsKeywords(StaticInputs):
    def load(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, copy_batch: bool) -> None:
        super().load(args, dict(self.kwargs), copy_batch=copy_batch)


class DropsSideInputs(LayerStackRunner):
    static_inputs_class = _DropsKeywords


class SlicesToBucket(LayerStackRunner):
    def slice_output(self, output: Any, *, bucket: int, num_tokens: int) -> Any:
        return output


class IgnoresHiddenMode(LayerStackRunner):
    def pad(self, batch: ForwardBatch, bucket: int) -> ForwardBatch:
        return dataclasses.replace(batch.padded_to(bucket), hidden_mode=HiddenMode.FULL)


class SilentFallback(LayerStackRunner):
    def discover(self, model: nn.Module) -> DiscoveryResult:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return super().discover(model)


class HandsOutStaticOutput(LayerStackRunner):
    def hand_out(self, output: Any) -> Any:
        return output


_MUTANTS: dict[str, tuple[type[LayerStackRunner], str]] = {
    "forget-restore": (ForgetsToRestoreForward,
                       "never puts layer_model.forward back: later eager calls silently replay a graph"),
    "restore-on-success-only": (RestoresOnlyOnSuccess,
                                "restores the forward without try/finally: an exception leaves the model patched"),
    "restore-on-exception-only": (RestoresOnlyOnException,
                                  "restores on Exception but not BaseException (KeyboardInterrupt leaves the patch)"),
    "no-no-grad": (NoGradModeSwitch,
                   "calls layer_model.forward without torch.no_grad(): compiled out= MoE kernels fail, "
                   "outputs get grad_fn"),
    "whole-model-capture": (CapturesWholeModel,
                            "captures the whole model (logits inside the graph) and still accepts several requests"),
    "bucket-off-by-one": (BucketOffByOne,
                          "picks the bucket after the right one (bisect_right): exact-size batches waste a bucket "
                          "and the largest bucket is never used"),
    "stale-positions": (StalePositions, "does not refresh the positions static buffer at replay"),
    "drop-side-inputs": (DropsSideInputs,
                         "drops the layer stack's keyword side inputs (DeepStack embeddings) at replay"),
    "slice-to-bucket": (SlicesToBucket, "slices outputs to the bucket size instead of the real token count"),
    "ignore-hidden-mode": (IgnoresHiddenMode, "ignores the batch's hidden-state mode and always returns all of them"),
    "silent-fallback": (SilentFallback, "falls back to a broader module without the discovery warning"),
    "alias-static-output": (HandsOutStaticOutput,
                            "hands out the graph's static output buffers: the next replay overwrites the "
                            "caller's result"),
}

for _name, (_cls, _bug) in _MUTANTS.items():
    impls.register("runner", _name, _cls, kind="mutant", bug=_bug)
