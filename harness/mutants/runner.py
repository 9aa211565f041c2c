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

from harness.errors import BucketError
from harness.batch import ForwardBatch, HiddenMode
from harness.runner.discovery import DiscoveryResult
from harness.mutants import MutantSet
from harness.runner.runner import LayerStackRunner, StaticInputs

__all__ = ["MUTANTS"]  # the mutants are reached through the registry, never imported by name

MUTANTS = MutantSet("runner")


@MUTANTS.add("forget-restore", bug="never puts layer_model.forward back: later eager calls silently replay a graph")
class ForgetsToRestoreForward(LayerStackRunner):
    @contextlib.contextmanager
    def patched_forward(self, replacement: Callable[..., Any]) -> Iterator[None]:
        self.layer_model.forward = replacement
        yield


@MUTANTS.add("restore-on-success-only", bug="restores the forward without try/finally: an exception leaves the model patched")
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


@MUTANTS.add("restore-on-exception-only", bug="restores on Exception but not BaseException (KeyboardInterrupt leaves the patch)")
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


@MUTANTS.add("no-no-grad", bug="calls layer_model.forward without torch.no_grad(): compiled out= MoE kernels fail, "
                    "outputs get grad_fn")
class NoGradModeSwitch(LayerStackRunner):
    def autograd_off(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


@MUTANTS.add("whole-model-capture", bug="captures the whole model (logits inside the graph) and still accepts several requests")
class CapturesWholeModel(LayerStackRunner):
    def discover(self, model: nn.Module) -> DiscoveryResult:
        # Logits processing inside the graph, yet not marked as a fallback: multi-request batches replay.
        return DiscoveryResult(model, "", False, "whole-model", ())


@MUTANTS.add("bucket-off-by-one", bug="picks the bucket after the right one (bisect_right): exact-size batches waste a bucket "
                    "and the largest bucket is never used")
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


@MUTANTS.add("stale-positions", bug="does not refresh the positions static buffer at replay")
class StalePositions(LayerStackRunner):
    static_inputs_class = _StalePositions


class _DropsKeywords(StaticInputs):
    def load(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, copy_batch: bool) -> None:
        super().load(args, dict(self.kwargs), copy_batch=copy_batch)


@MUTANTS.add("drop-side-inputs", bug="drops the layer stack's keyword side inputs (DeepStack embeddings) at replay")
class DropsSideInputs(LayerStackRunner):
    static_inputs_class = _DropsKeywords


@MUTANTS.add("slice-to-bucket", bug="slices outputs to the bucket size instead of the real token count")
class SlicesToBucket(LayerStackRunner):
    def slice_output(self, output: Any, *, bucket: int, num_tokens: int) -> Any:
        return output


@MUTANTS.add("ignore-hidden-mode", bug="ignores the batch's hidden-state mode and always returns all of them")
class IgnoresHiddenMode(LayerStackRunner):
    def pad(self, batch: ForwardBatch, bucket: int) -> ForwardBatch:
        return dataclasses.replace(batch.padded_to(bucket), hidden_mode=HiddenMode.FULL)


@MUTANTS.add("silent-fallback", bug="falls back to a broader module without the discovery warning")
class SilentFallback(LayerStackRunner):
    def discover(self, model: nn.Module) -> DiscoveryResult:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return super().discover(model)


@MUTANTS.add("alias-static-output", bug="hands out the graph's static output buffers: the next replay overwrites the "
                    "caller's result")
class HandsOutStaticOutput(LayerStackRunner):
    def hand_out(self, output: Any) -> Any:
        return output
