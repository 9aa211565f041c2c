"""Mutants of the ``runner`` component: the reference runner with one real bug each.

Each overrides one seam of :class:`~harness.runner.LayerStackRunner`; ``suites/runner`` must kill every one."""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from harness.batch import ForwardBatch, HiddenMode, current_batch, forward_context, request_offsets
from harness.errors import BucketError
from harness.mutants import MutantSet, runner_distributed
from harness.runner.discovery import DiscoveryResult, layer_list
from harness.runner.runner import LayerStackRunner, StaticInputs

__all__ = ["MUTANTS"]  # the mutants are reached through the registry, never imported by name

MUTANTS = MutantSet("runner")


@MUTANTS.add("forget-restore", bug="never puts layer_model.forward back: later eager calls silently replay a graph")
class ForgetsToRestoreForward(LayerStackRunner):
    @contextlib.contextmanager
    def patched_forward(self, replacement: Callable[..., Any]) -> Iterator[None]:
        self.layer_model.forward = replacement
        yield


@MUTANTS.add("restore-on-success-only",
             bug="restores the forward without try/finally: an exception leaves the model patched")
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


@MUTANTS.add("restore-on-exception-only",
             bug="restores on Exception but not BaseException (KeyboardInterrupt leaves the patch)")
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


@MUTANTS.add("whole-model-capture",
             bug="captures the whole model (logits inside the graph) and still accepts several requests")
class CapturesWholeModel(LayerStackRunner):
    def discover(self, model: nn.Module) -> DiscoveryResult:
        # Logits processing inside the graph, yet not marked as a fallback: multi-request batches replay.
        return DiscoveryResult(model, "", False, "whole-model", ())


@MUTANTS.add("bucket-off-by-one",
             bug="picks the bucket after the right one (bisect_right): exact-size batches waste a bucket and the "
                 "largest bucket is never used")
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


# -- the runner's life between and around calls (suites/runner/test_lifecycle_machine.py) ---------


@MUTANTS.add("copies-only-when-sliced", bug="copies outputs only when it cuts them: a batch that exactly fills its "
                    "bucket gets the graph's static buffers, which the next replay overwrites")
class CopiesOnlyWhenSliced(LayerStackRunner):
    def slice_output(self, output: Any, *, bucket: int, num_tokens: int) -> Any:
        if num_tokens == bucket:
            return output
        return super().hand_out(super().slice_output(output, bucket=bucket, num_tokens=num_tokens))

    def hand_out(self, output: Any) -> Any:
        return output  # "already copied by the slice"


@MUTANTS.add("fallback-checks-request-count-only", bug="after a discovery fallback replays any single-request batch, "
                    "though the graph froze hidden mode none and last-token logits")
class FallbackChecksRequestCountOnly(LayerStackRunner):
    def can_run(self, batch: ForwardBatch) -> bool:
        try:
            bucket = self.bucket_for(self.rows(batch))
        except BucketError:
            return False
        return bucket in self.captured_buckets() and (not self.discovery.fell_back or batch.num_requests == 1)


@MUTANTS.add("eager-fallback-with-grad", bug="the eager fallback runs the model with the caller's autograd mode: "
                    "outputs carry grad_fn, compiled out= kernels fail")
class EagerFallbackWithGrad(LayerStackRunner):
    def run_eagerly(self, batch: ForwardBatch) -> Any:
        output = self.model(batch.input_ids, batch.positions, batch)
        return self.slice_output(output, bucket=self.rows(batch), num_tokens=batch.num_tokens)


@MUTANTS.add("nested-runs-eagerly", bug="a run() inside a replay goes eager instead of raising: the model's layer "
                    "stack is still patched, so at the outer bucket's size it replays over the outer's buffers")
class NestedRunsEagerly(LayerStackRunner):
    def run(self, batch: ForwardBatch) -> Any:
        if self.in_replay:  # "eager is always safe"
            self.stats.eager_fallbacks += 1
            return self.run_eagerly(batch)
        return super().run(batch)


@MUTANTS.add("leaks-forward-context", bug="publishes the padded batch as the forward context and never unpublishes it: "
                    "attention outside any forward silently reads a stale batch")
class LeaksForwardContext(LayerStackRunner):
    @contextlib.contextmanager
    def publish(self, batch: ForwardBatch) -> Iterator[None]:
        context = forward_context(batch)
        context.__enter__()  # entered, never exited
        vars(self).setdefault("_published", []).append(context)  # kept alive: collecting it would exit it
        yield


@MUTANTS.add("patches-the-class", bug="replaces forward on the layer module's class, not the instance: every other "
                    "instance of the class runs the replay closure while a replay is under way")
class PatchesTheClass(LayerStackRunner):
    @contextlib.contextmanager
    def patched_forward(self, replacement: Callable[..., Any]) -> Iterator[None]:
        cls = type(self.layer_model)
        original = cls.__dict__["forward"]
        cls.forward = lambda module, *args, **kwargs: replacement(*args, **kwargs)
        try:
            yield
        finally:
            cls.forward = original


@MUTANTS.add("restores-a-bound-method", bug="saves layer_model.forward by value and assigns it back: a bound method "
                    "stays in the instance __dict__ and shadows later class-level patches")
class RestoresABoundMethod(LayerStackRunner):
    @contextlib.contextmanager
    def patched_forward(self, replacement: Callable[..., Any]) -> Iterator[None]:
        layer = self.layer_model
        original = layer.forward
        layer.forward = replacement
        try:
            yield
        finally:
            layer.forward = original


# The replay under way in the process, innermost last: one for every runner and every thread.
_REPLAYS_UNDER_WAY: list[Callable[..., Any]] = []


@MUTANTS.add("replay-dispatched-through-a-global", bug="the patched layer forward dispatches to the replay under way "
                    "in a module-level slot (as an engine's global forward context): right for one caller at a "
                    "time, but two runners replaying from two threads at once both run the later one's graph")
class ReplayDispatchedThroughAGlobal(LayerStackRunner):
    @contextlib.contextmanager
    def patched_forward(self, replacement: Callable[..., Any]) -> Iterator[None]:
        def dispatch(*args: Any, **kwargs: Any) -> Any:
            return _REPLAYS_UNDER_WAY[-1](*args, **kwargs)

        _REPLAYS_UNDER_WAY.append(replacement)
        try:
            with super().patched_forward(dispatch):
                yield
        finally:
            _REPLAYS_UNDER_WAY.remove(replacement)


# -- decode with a paged KV cache (suites/runner/test_decode.py) ---------------------------------


@MUTANTS.add("replays-twice", bug="replays the graph twice per call (a warm-up replay left in): the attention "
                    "breaks write the KV cache twice")
class ReplaysTwice(LayerStackRunner):
    @contextlib.contextmanager
    def patched_forward(self, replacement: Callable[..., Any]) -> Iterator[None]:
        def twice(*args: Any, **kwargs: Any) -> Any:
            replacement(*args, **kwargs)
            return replacement(*args, **kwargs)

        with super().patched_forward(twice):
            yield


@MUTANTS.add("pads-into-live-slots", bug="pads the slot mapping with slot 0 instead of the padding slot: the padded "
                    "tail writes into a live request's KV-cache slot")
class PadsIntoLiveSlots(LayerStackRunner):
    def pad(self, batch: ForwardBatch, bucket: int) -> ForwardBatch:
        padded = batch.padded_to(bucket)
        if padded.kv is None:
            return padded
        slots = padded.kv.slot_mapping.clamp(min=0)  # PAD_SLOT (-1) becomes slot 0
        return dataclasses.replace(padded, kv=dataclasses.replace(padded.kv, slot_mapping=slots))


@MUTANTS.add("kv-metadata-unpadded", bug="pads the tokens to the bucket but hands attention the live batch's KV "
                    "metadata, a slot mapping of the real tokens only (metadata built from the live batch, not the "
                    "bucket: vLLM PR 36626): no pad row has a slot, which the zoo's batch refuses (BatchError) and a "
                    "kernel that reads one slot per row reads past the end for")
class KvMetadataUnpadded(LayerStackRunner):
    def pad(self, batch: ForwardBatch, bucket: int) -> ForwardBatch:
        padded = batch.padded_to(bucket)
        return padded if padded.kv is None else dataclasses.replace(padded, kv=batch.kv)


@MUTANTS.add("stale-slot-mapping", bug="copies the slot mapping into a per-bucket static buffer at the first replay "
                    "only: later steps write their keys and values into the first step's slots")
class StaleSlotMapping(LayerStackRunner):
    def pad(self, batch: ForwardBatch, bucket: int) -> ForwardBatch:
        padded = batch.padded_to(bucket)
        if padded.kv is None:
            return padded
        first = vars(self).setdefault("_first_slot_mapping", {}).setdefault(bucket, padded.kv.slot_mapping)
        return dataclasses.replace(padded, kv=dataclasses.replace(padded.kv, slot_mapping=first))


@MUTANTS.add("stale-seq-lens", bug="keeps a bucket's per-request KV sequence lengths from its first replay while they "
                    "still cover the new tokens: attention reads too few cached tokens in later decode steps")
class StaleSeqLens(LayerStackRunner):
    def pad(self, batch: ForwardBatch, bucket: int) -> ForwardBatch:
        padded = batch.padded_to(bucket)
        if padded.kv is None:
            return padded
        kept = vars(self).setdefault("_kv_lens", {})
        key = (bucket, padded.num_requests)
        stale = kept.get(key)
        # Refreshed only when the static lengths cannot describe the batch at all (fewer than its new
        # tokens, or past the pages it owns), as a runner that updates its metadata on "shape changes".
        capacity = [len(table) * padded.kv.block_size for table in padded.kv.block_tables]
        if stale is None or any(not new <= old <= room for old, new, room in zip(stale, padded.seq_lens, capacity)):
            kept[key] = stale = padded.kv.kv_lens
        return dataclasses.replace(padded, kv=dataclasses.replace(padded.kv, kv_lens=stale))


# -- pad rows' metadata and padding requests (suites/runner/test_pad_rows.py, test_padding_requests.py) ----------


class _RefreshesRealRowsOnly(StaticInputs):
    def load(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, copy_batch: bool) -> None:
        real = current_batch().num_tokens  # the padded live batch the runner published

        def real_rows(static: Any, live: Any) -> Any:
            # buf[:n].copy_(live[:n]), as engines refresh their static buffers; rows n: keep what they held
            if isinstance(static, torch.Tensor) and isinstance(live, torch.Tensor) and static.dim() \
                    and static.shape == live.shape and static.shape[0] == self.bucket:
                return torch.cat([live[:real], static[real:]])
            return live

        super().load(tuple(real_rows(s, a) for s, a in zip(self.args, args)),
                     {key: real_rows(self.kwargs.get(key), value) for key, value in kwargs.items()},
                     copy_batch=copy_batch)


@MUTANTS.add("stale-pad-rows", bug="refreshes only the real rows of the per-token static buffers (buf[:n].copy_): "
                    "pad rows keep the capture's or a previous, larger batch's positions and request-pool indices, "
                    "which attention indexes KV memory with (SGLang #24401, #22958)")
class StalePadRows(LayerStackRunner):
    static_inputs_class = _RefreshesRealRowsOnly


@MUTANTS.add("pads-with-last-row", bug="pads a batch by repeating its last real row's positions and per-token side "
                    "inputs instead of the padding fill: pad rows address a live request's KV entry, which attention "
                    "reads and writes as that request's")
class PadsWithLastRow(LayerStackRunner):
    def pad(self, batch: ForwardBatch, bucket: int) -> ForwardBatch:
        padded = batch.padded_to(bucket)
        real = batch.num_tokens

        def replicate(tensor: torch.Tensor) -> torch.Tensor:
            if real == tensor.shape[0]:
                return tensor
            return torch.cat([tensor[:real], tensor[real - 1:real].expand(tensor.shape[0] - real, *tensor.shape[1:])])

        return dataclasses.replace(padded, positions=replicate(padded.positions),
                                   side_inputs={name: replicate(t) for name, t in padded.side_inputs.items()})


@MUTANTS.add("pads-hidden-inputs-unwritten", bug="pads the float per-token side inputs (hidden inputs such as "
                    "DeepStack embeddings) with rows it allocates and never writes (torch.empty, as a static buffer "
                    "refreshed only in its first n rows): whatever memory held reaches a cross-token op through the "
                    "pad rows (vLLM #40047)")
class PadsHiddenInputsUnwritten(LayerStackRunner):
    def pad(self, batch: ForwardBatch, bucket: int) -> ForwardBatch:
        padded = batch.padded_to(bucket)
        real = batch.input_ids.shape[0]

        def unwritten(tensor: torch.Tensor) -> torch.Tensor:
            if not tensor.is_floating_point() or real == tensor.shape[0]:
                return tensor
            rows = tensor.new_empty(tensor.shape)
            rows[:real] = tensor[:real]
            return rows

        return dataclasses.replace(padded, side_inputs={name: unwritten(t) for name, t in padded.side_inputs.items()})


@MUTANTS.add("requests-bounded-by-tokens", bug="keeps each bucket's per-request metadata (the last-token indices the "
                    "logits read) in a static buffer of one entry per token, the most requests a bucket holds when no "
                    "request is empty: a batch padded with zero-length requests past that crashes the copy")
class RequestsBoundedByTokens(LayerStackRunner):
    def pad(self, batch: ForwardBatch, bucket: int) -> ForwardBatch:
        padded = batch.padded_to(bucket)
        buffers = vars(self).setdefault("_last_indices", {})
        if bucket not in buffers:
            with torch.inference_mode(False):  # a normal tensor: calls in and out of inference mode update it
                buffers[bucket] = torch.zeros(bucket, dtype=torch.long, device=padded.device)
        static = buffers[bucket]
        static[:padded.num_requests].copy_(padded.last_indices)
        return dataclasses.replace(padded, last_indices=static[:padded.num_requests])


@MUTANTS.add("requests-from-token-map", bug="rebuilds the replayed batch's request lengths from its per-token request "
                    "ids (their run lengths, as from batch_id_per_token), which cannot see a request with no tokens: "
                    "zero-length padding requests vanish, and their logits rows with them")
class RequestsFromTokenMap(LayerStackRunner):
    def pad(self, batch: ForwardBatch, bucket: int) -> ForwardBatch:
        padded = batch.padded_to(bucket)
        request_of_token = torch.repeat_interleave(torch.arange(padded.num_requests),
                                                   torch.tensor(padded.seq_lens))
        _, counts = torch.unique_consecutive(request_of_token, return_counts=True)
        lengths = tuple(int(n) for n in counts)
        starts, last = request_offsets(lengths)
        return dataclasses.replace(padded, seq_lens=lengths, start_offsets=starts,
                                   last_indices=torch.tensor(last, device=padded.device), num_padding_requests=0)


# -- the speculative-decode loop (suites/runner/test_speculative.py) ------------------------------


@MUTANTS.add("verify-batches-run-eagerly", bug="refuses speculative verify batches (all logits plus hidden states) "
                    "and silently runs them eagerly: the graph never serves speculative decoding")
class VerifyBatchesRunEagerly(LayerStackRunner):
    def can_run(self, batch: ForwardBatch) -> bool:
        if batch.all_logits and batch.hidden_mode != HiddenMode.NONE:
            return False
        return super().can_run(batch)


@MUTANTS.add("verify-keeps-last-hidden", bug="treats every all-logits batch as a verify batch that needs last-token "
                    "hidden states only: a draft asking for every token's hidden states gets one per request")
class VerifyKeepsLastHidden(LayerStackRunner):
    def pad(self, batch: ForwardBatch, bucket: int) -> ForwardBatch:
        padded = batch.padded_to(bucket)
        if padded.all_logits and padded.hidden_mode == HiddenMode.FULL:
            return dataclasses.replace(padded, hidden_mode=HiddenMode.LAST)
        return padded


# -- divergence localisation (suites/runner/architectures) --------------------------------------


@MUTANTS.add("perturb-middle-layer", bug="captures a small error into the middle decoder layer: replays differ from "
                                        "eager from that layer on")
class PerturbsMiddleLayerAtReplay(LayerStackRunner):
    @contextlib.contextmanager
    def record_layers(self, static: StaticInputs) -> Iterator[None]:
        # A hook live only while capturing: the perturbation is in the graph, so every replay carries
        # it and eager never does, as a miscompiled or mis-fused kernel of one layer would.
        from harness.runner.discovery import layer_list

        found = layer_list(self.layer_model)
        handle = None
        if found is not None:
            middle = found[1][len(found[1]) // 2]

            def perturb(module: Any, args: Any, output: Any) -> Any:
                if isinstance(output, tuple):
                    return (output[0] + 1e-2, *output[1:])
                return output + 1e-2

            handle = middle.register_forward_hook(perturb)
        try:
            with super().record_layers(static):
                yield
        finally:
            if handle is not None:
                handle.remove()


# --- hooks on the layer stack and per-layer recording ------------------------------------------------


@MUTANTS.add("hooks-run-twice", bug="the replay closure calls the layer module's forward pre-hooks and hooks itself "
                    "(thinking a replaced forward skips them): nn.Module.__call__ runs them too, so they run twice")
class HooksRunTwice(LayerStackRunner):
    @contextlib.contextmanager
    def patched_forward(self, replacement: Callable[..., Any]) -> Iterator[None]:
        layer = self.layer_model

        def with_hooks(*args: Any, **kwargs: Any) -> Any:
            for hook in list(layer._forward_pre_hooks.values()):
                changed = hook(layer, args)
                args = args if changed is None else (changed if isinstance(changed, tuple) else (changed,))
            output = replacement(*args, **kwargs)
            for hook in list(layer._forward_hooks.values()):
                changed = hook(layer, args, output)
                output = output if changed is None else changed
            return output

        with super().patched_forward(with_hooks):
            yield


@MUTANTS.add("layer-hooks-kept-out-of-graph", bug="hooks on the decoder layers are taken off while capturing (to keep "
                    "profiler hooks out of the graph), so their work never happens at replay")
class LayerHooksKeptOutOfGraph(LayerStackRunner):
    @contextlib.contextmanager
    def record_layers(self, static: StaticInputs) -> Iterator[None]:
        found = layer_list(self.layer_model)
        layers = list(found[1]) if found else []
        saved = [(dict(layer._forward_pre_hooks), dict(layer._forward_hooks)) for layer in layers]
        for layer in layers:
            layer._forward_pre_hooks.clear()
            layer._forward_hooks.clear()
        try:
            with super().record_layers(static):
                yield
        finally:
            for layer, (pre, post) in zip(layers, saved):
                layer._forward_pre_hooks.update(pre)
                layer._forward_hooks.update(post)


@MUTANTS.add("layers-recorded-in-largest-bucket-only", bug="records per-layer outputs while capturing the first "
                    "(largest) bucket only: other buckets localise nothing, which must not read as no divergence")
class LayersRecordedInLargestBucketOnly(LayerStackRunner):
    @contextlib.contextmanager
    def record_layers(self, static: StaticInputs) -> Iterator[None]:
        if static.bucket != max(self.buckets):
            yield
            return
        with super().record_layers(static):
            yield


# -- what the outer model hands the stack, and what it hands back (suites/runner/test_stack_arguments.py) --


class _KeepsCaptured(StaticInputs):
    """Static inputs that skip, at replay, every argument whose captured value :meth:`kept` says stays as captured."""

    @staticmethod
    def kept(static: Any) -> bool:
        raise NotImplementedError

    def load(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, copy_batch: bool) -> None:
        def keep(static: Any, live: Any) -> Any:
            return static if self.kept(static) else live

        super().load(tuple(keep(s, a) for s, a in zip(self.args, args)),
                     {key: keep(self.kwargs.get(key), value) for key, value in kwargs.items()}, copy_batch=copy_batch)


class _KeepsCapturedScalars(_KeepsCaptured):
    kept = staticmethod(lambda static: isinstance(static, (bool, int, float, str)))  # "scalars are not buffers"


@MUTANTS.add("ignores-changed-scalars", bug="copies tensors into the static inputs and skips Python scalars: a keyword "
                    "such as an MTP draft-step index that changes between calls silently replays the capture's value")
class IgnoresChangedScalars(LayerStackRunner):
    static_inputs_class = _KeepsCapturedScalars


class _KeepsCapturedContainers(_KeepsCaptured):
    kept = staticmethod(lambda static: isinstance(static, (tuple, list, dict)))  # only top-level tensors are copied


@MUTANTS.add("container-members-frozen",
             bug="copies the stack's tensor arguments but not tensors inside lists and dicts: per-layer DeepStack "
                 "embeddings (or a VLM's mask per attention type) keep the capture's values")
class ContainerMembersFrozen(LayerStackRunner):
    static_inputs_class = _KeepsCapturedContainers


class _KeepsCapturedNones(_KeepsCaptured):
    kept = staticmethod(lambda static: static is None)  # "it was None at capture: nothing to copy"


@MUTANTS.add("ignores-input-where-capture-saw-none",
             bug="skips an argument that was None at capture: a batch with image embeddings (input_embeds, None for "
                 "the text-only dummy) replays the text embeddings silently")
class IgnoresInputWhereCaptureSawNone(LayerStackRunner):
    static_inputs_class = _KeepsCapturedNones


class _CopiesFromTheBatch(StaticInputs):
    def load(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, copy_batch: bool) -> None:
        batch = current_batch()  # the padded live batch the runner published
        if batch is not None and len(args) >= 2 and getattr(args[0], "shape", None) == batch.input_ids.shape:
            args = (batch.input_ids, batch.positions, *args[2:])  # as a whole-model runner fills its buffers
        super().load(args, kwargs, copy_batch=copy_batch)


@MUTANTS.add("stack-inputs-from-the-batch",
             bug="fills the static token ids and positions from the batch, not from the arguments the outer model "
                 "passed the stack: a model that shifts its positions (OPT) replays unshifted")
class StackInputsFromTheBatch(LayerStackRunner):
    static_inputs_class = _CopiesFromTheBatch


@MUTANTS.add("hands-out-logits-output-only",
             bug="copies the fields of a logits-output dataclass and bare tensors only: a model handing out a dict or "
                 "tuple (EAGLE-3 auxiliary hidden states) gets the graph's static buffers")
class HandsOutLogitsOutputOnly(LayerStackRunner):
    def hand_out(self, output: Any) -> Any:
        if isinstance(output, torch.Tensor) or dataclasses.is_dataclass(output):
            return super().hand_out(output)
        return output  # "models return LogitsOutput"


@MUTANTS.add("original-forward-saved-once",
             bug="keeps the layer's original forward from its first patch (at capture) and restores that one ever "
                 "after: a wrapper the user installs or removes later is undone by the next call")
class OriginalForwardSavedOnce(LayerStackRunner):
    @contextlib.contextmanager
    def patched_forward(self, replacement: Callable[..., Any]) -> Iterator[None]:
        layer = self.layer_model
        original = vars(self).setdefault("_original_forward", layer.__dict__.get("forward"))
        layer.forward = replacement
        try:
            yield
        finally:
            if original is None:
                del layer.forward
            else:
                layer.forward = original


@MUTANTS.add("graph-reads-private-weight-copy", bug="captures against copies of the stack's parameters (made when it "
                    "converts them for capture): weights updated in place later (RL weight sync, LoRA swap) never "
                    "reach the replays")
class GraphReadsPrivateWeightCopy(LayerStackRunner):
    @contextlib.contextmanager
    def record_layers(self, static: StaticInputs) -> Iterator[None]:
        swapped = [(module, name, parameter) for module in self.layer_model.modules()
                   for name, parameter in module._parameters.items() if parameter is not None]
        copies = vars(self).setdefault("_weight_copies", [])  # kept alive as long as the graphs that read them
        for module, name, parameter in swapped:
            copies.append(nn.Parameter(parameter.detach().clone(), requires_grad=parameter.requires_grad))
            module._parameters[name] = copies[-1]
        try:
            with super().record_layers(static):
                yield
        finally:
            for module, name, parameter in swapped:
                module._parameters[name] = parameter


@MUTANTS.add("inference-mode-not-kept", bug="runs captures and replays under no_grad whatever mode it was built in: "
                    "built under torch.inference_mode() its static buffers are inference tensors, and a call outside "
                    "inference mode fails to update them in place")
class InferenceModeNotKept(LayerStackRunner):
    def autograd_off(self) -> contextlib.AbstractContextManager:
        return torch.no_grad()


class _WritesKeptInTheGraph(StaticInputs):
    def store(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        return []


@MUTANTS.add("argument-writes-lost", bug="copies the live arguments into the static ones but never the graph's writes "
                    "back: a stack that writes its arguments in place (a fused add-RMSNorm's residual, positions a "
                    "draft loop steps) leaves the caller's tensors as they were, where eager writes them")
class ArgumentWritesLost(LayerStackRunner):
    static_inputs_class = _WritesKeptInTheGraph


@MUTANTS.add("argument-writes-left-in-padding", bug="hands the graph's writes back to the padded batch only: a batch "
                    "the runner had to pad (a copy) never sees them, while an exact fill of a bucket does")
class ArgumentWritesLeftInPadding(LayerStackRunner):
    def return_writes(self, batch: ForwardBatch, padded: ForwardBatch, written: Sequence[torch.Tensor]) -> None:
        return None


@MUTANTS.add("ignores-moved-state", bug="never notices that a buffer was re-allocated between replays (an engine's "
                    "memory release and resume moved its recurrent state): the graphs keep reading and writing the "
                    "old, freed memory")
class IgnoresMovedState(LayerStackRunner):
    def state_moved(self) -> bool:
        return False


# -- tensor parallelism (suites/runner/tensor_parallel): a module of their own -------------------

MUTANTS.include(runner_distributed.MUTANTS)


@MUTANTS.add("reads-buckets-twice", bug="reads the buckets argument twice (its largest size, then the sizes to "
             "capture): buckets given as a generator, an Iterable[int] like any other, are empty the second time "
             "and the runner refuses them")
class ReadsBucketsTwice(LayerStackRunner):
    def __init__(self, model: nn.Module, *, buckets: Any, **options: Any) -> None:
        self.max_tokens = max(buckets, default=0)  # the largest batch, noted before the buckets are validated
        super().__init__(model, buckets=buckets, **options)


@MUTANTS.add("keeps-last-batch", bug="keeps the last batch it ran in an attribute (for a debug dump): the caller's "
             "batch and its tensors stay alive after the caller drops them, until the next call")
class KeepsLastBatch(LayerStackRunner):
    def run(self, batch: ForwardBatch) -> Any:
        self.last_batch = batch
        return super().run(batch)


@MUTANTS.add("constructs-in-defaults", bug="builds and captures its layer stacks under torch's defaults (float32 "
             "default dtype, autocast off) whatever context the engine set, and puts the engine's back after: the "
             "replays run another program than the one the engine runs eagerly")
class ConstructsInDefaults(LayerStackRunner):
    def __init__(self, model: nn.Module, **options: Any) -> None:
        dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)
        try:
            with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
                super().__init__(model, **options)
        finally:
            torch.set_default_dtype(dtype)


@MUTANTS.add("tower-judged-by-own-path", bug="judges a searched layer stack a modality tower's by its own path and "
             "class only, not its ancestors': a stack below a tower that only its class names (a SiglipVisionModel "
             "held at 'encoder') is taken for the text stack when it is the shallowest, and capture fails or captures "
             "the tower")
class TowerJudgedByOwnPath(LayerStackRunner):
    def discover(self, model: nn.Module) -> DiscoveryResult:
        from harness.runner import discovery

        ancestors = discovery._ancestors
        discovery._ancestors = lambda model, path: []  # a dotted path split on whitespace: no ancestors at all
        try:
            return super().discover(model)
        finally:
            discovery._ancestors = ancestors
