"""The runner's life between and around calls, as a hypothesis state machine.

Rules, in any order: batches through ``run`` and ``replay`` (every bucket, exact fills, past the
largest bucket, arriving pre-padded, one or many requests, every hidden mode, ``all_logits``), under
every calling mode (grad, no_grad, inference_mode); Exception, BaseException and KeyboardInterrupt
raised from the outer forward and from an eager break; ``run``/``replay`` called from inside a replay
(from the attention break), at the outer bucket's size too; a second instance of the model class
running eagerly inside a replay; between calls, an instance-level ``forward`` wrapper installed on the
layer module or taken off it (as profilers and adapters do), and the weights updated in place (an RL
weight sync, a LoRA swap). Each machine starts from a model whose layer module may already carry such
a wrapper and a forward hook. Machines: a model whose discovery finds the stack, and one whose
discovery fell back (its graph is the whole model).

Every call goes through ``check_run`` (harness.oracle): it equals eager on everything a caller can observe,
values, output metadata (no ``grad_fn``), process and model state left behind; a call that raises leaves the
process and the model as it found them. After every step: every output ever handed out keeps the value it was
handed out with (eager's, with the weights of its time); the layer module's instance and class ``__dict__`` are
exactly what the user last left there (before the runner existed, or after their latest wrapper change); no
forward context is published; the counters add up; the runner still replays.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from harness.batch import published_batch
from harness.compare import assert_equivalent
from harness.errors import BucketError, HarnessError, ReplayError
from harness.graphs import eager_on_graph
from harness.models import build_model, packed_causal_attention
from harness.oracle import CALLING_MODES, Checker, calling_mode, context_key
from harness.runner import ForwardBatch, select_bucket
from harness.runner.cases import SEED, ambiguous_requests, eager, make_batch, split_strategy

pytestmark = pytest.mark.clause("lifecycle")

BUCKETS = (2, 4, 8)  # small buckets: every example captures all of them, twice per machine kind
MAX = BUCKETS[-1]
# name -> (zoo model, dotted path of the layer module, discovery falls back). No rule knows the layout
# of odd-unnamed-layers, so the fell-back model's graph is the whole CausalLM, logits processor and
# the batch's Python-level choices included.
MACHINES = {"normal": ("dense", "model", False), "fell-back": ("odd-unnamed-layers", "", True)}
CALLING = st.sampled_from(CALLING_MODES)
EXCEPTIONS = {"Exception": RuntimeError, "BaseException": type("Abort", (BaseException,), {}),
              "KeyboardInterrupt": KeyboardInterrupt}


@dataclasses.dataclass
class _Hooks:
    """What the model's hook points do in the current step: ``in_break`` runs inside the first
    attention break of a forward, ``after_forward`` in the outer model's forward hook."""

    in_break: Callable[[], None] | None = None
    after_forward: Callable[[], None] | None = None
    wrapper_calls: int = 0


@dataclasses.dataclass
class _Subject:
    """A model with its hook points, its layer module's dicts before the runner, and the runner."""

    model: torch.nn.Module
    twin: torch.nn.Module
    layer: torch.nn.Module
    hooks: _Hooks
    instance_dict: dict[str, Any]
    class_dict: dict[str, Any]
    runner: Any
    weights: dict[str, torch.Tensor]  # the parameters as built, put back after each example
    moves: int = 0  # how often the examples re-allocated the parameters (move_weights), which reset() cannot undo

    def reset(self) -> None:
        """Undo what an example's rules changed on the cached model: its weights and the layer's forward."""
        with torch.no_grad():
            for name, parameter in self.model.named_parameters():
                parameter.copy_(self.weights[name])
        self.layer.__dict__.pop("forward", None)
        if "forward" in self.instance_dict:
            self.layer.forward = self.instance_dict["forward"]


def _build_subject(kind: str, wrapper: bool, hook: bool, build_runner: Callable[..., Any],
                   device: torch.device) -> _Subject:
    name, path, _ = MACHINES[kind]
    model = build_model(name, seed=SEED, device=device, requires_grad=True)
    hooks = _Hooks()

    @eager_on_graph
    def hooked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        action, hooks.in_break = hooks.in_break, None  # once per forward: the first layer's break
        if action is not None:
            action()
        return packed_causal_attention.__wrapped__(q, k, v)

    for module in model.modules():
        if hasattr(module, "kernel"):
            module.kernel = hooked_attention

    def after_forward(module: torch.nn.Module, args: Any, output: Any) -> None:
        action, hooks.after_forward = hooks.after_forward, None
        if action is not None:
            action()

    model.register_forward_hook(after_forward)
    layer = model.get_submodule(path)
    if wrapper:  # an instance-level forward wrapper installed before the runner (profilers, adapters do)
        inner = layer.forward

        def counting_forward(*args: Any, **kwargs: Any) -> Any:
            hooks.wrapper_calls += 1
            return inner(*args, **kwargs)

        layer.forward = counting_forward
    if hook:
        layer.register_forward_pre_hook(lambda module, args: None)
    instance_dict, class_dict = dict(layer.__dict__), dict(type(layer).__dict__)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner = build_runner(model, buckets=BUCKETS)
    twin = build_model(name, seed=SEED + 1, device=device)
    weights = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    return _Subject(model, twin, layer, hooks, instance_dict, class_dict, runner, weights)


def _same_dict(now: dict[str, Any], before: dict[str, Any], what: str) -> None:
    added, removed = sorted(set(now) - set(before)), sorted(set(before) - set(now))
    changed = sorted(k for k in set(now) & set(before) if now[k] is not before[k])
    assert not (added or removed or changed), (
        f"{what} differs from what the user last left there (before the runner existed, or their latest change): "
        f"added {added}, removed {removed}, replaced {changed}")


def _clone(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{f.name: _clone(getattr(value, f.name)) for f in dataclasses.fields(value)})
    return value.clone() if isinstance(value, torch.Tensor) else value


def _lengths(max_tokens: int = MAX + 3) -> st.SearchStrategy[list[int]]:
    edges = [n for n in (*BUCKETS, MAX + 1) if n <= max_tokens]  # exact fills, and just past the largest
    totals = st.one_of(st.sampled_from(edges), st.integers(1, max_tokens))
    return totals.flatmap(lambda total: split_strategy(total, max_requests=6))


def _machine(kind: str, subjects: Callable[[bool, bool], _Subject], device: torch.device,
             check_run: Callable[..., Any], checker: Checker, context: Callable[..., dict]
             ) -> type[RuleBasedStateMachine]:
    name, _, fell_back = MACHINES[kind]

    class RunnerLifecycle(RuleBasedStateMachine):
        @initialize(wrapper=st.booleans(), hook=st.booleans())
        def build(self, wrapper: bool, hook: bool) -> None:
            self.subject = subjects(wrapper, hook)
            self.runner, self.model = self.subject.runner, self.subject.model
            self.instance_dict = dict(self.subject.instance_dict)  # what the user last left on the layer
            stats = self.runner.stats
            self.base = (stats.replays, stats.eager_fallbacks, dict(stats.replays_by_bucket))
            self.expected_replays, self.expected_fallbacks = 0, 0
            self.unsure = 0  # calls that raised half-way: each may or may not have been counted
            self.disturbed = True  # an exception or a nested call happened since the last usability probe
            self.kept: list[tuple[Any, Any, str]] = []
            self.seed = 0

        # -- helpers --------------------------------------------------------------------------

        def _batch(self, lengths: list[int], mode: str, all_logits: bool, pad: int,
                   padding_requests: int = 0) -> ForwardBatch:
            self.seed += 1
            batch = make_batch(name, lengths, seed=self.seed, dtype=torch.float32, device=device, hidden_mode=mode,
                               all_logits=all_logits)
            if padding_requests:
                batch = batch.padded_requests_to(batch.num_requests + padding_requests)
            batch = batch.padded_to(batch.num_tokens + pad) if pad else batch
            while ambiguous_requests(batch, BUCKETS):  # outside the contract: one padding request more
                batch = batch.padded_requests_to(batch.num_requests + 1)
            return batch

        def _replayable(self, batch: ForwardBatch) -> bool:
            # The contract, from the docs: a bucket holds every row the batch carries; a fell-back
            # graph replays only what matches its dummy capture.
            rows = batch.num_tokens + batch.num_padding
            dummy_like = batch.num_requests == 1 and str(batch.hidden_mode) == "none" and not batch.all_logits
            return rows <= MAX and (dummy_like or not fell_back)

        def _describe(self, batch: ForwardBatch, via: str, calling: str | None) -> str:
            return f"{via}({batch.describe()})" + (f" under {calling}" if calling else "")

        def _call(self, via: str, batch: ForwardBatch, *, in_break: Callable[[], None] | None = None) -> Any:
            """``runner.run`` or ``runner.replay`` on ``batch``; ``in_break`` runs inside its first break."""
            self.subject.hooks.in_break = in_break
            try:
                return getattr(self.runner, via)(batch)
            finally:
                self.subject.hooks.in_break = None

        def _checked(self, via: str, batch: ForwardBatch, what: str, *, calling: str | None = None,
                     in_break: Callable[[], None] | None = None) -> Any:
            """``_call`` through ``check_run``: eager first (without the step's action in its break), then the
            runner, compared on everything a caller sees; the output is kept for the invariants."""

            def call(batch: ForwardBatch) -> Any:
                return self._call(via, batch, in_break=in_break)

            call.__name__ = via
            output = check_run(self.runner, self.model, batch, via=call, mode=calling, buckets=BUCKETS,
                               replayed=self._replayable(batch), machine=kind, call=what, model=name)
            self.kept.append((output, _clone(output), what))
            return output

        # -- rules ----------------------------------------------------------------------------

        @rule(lengths=_lengths(), mode=st.sampled_from(["none", "last", "full"]), all_logits=st.booleans(),
              pad=st.integers(0, 3), via=st.sampled_from(["run", "replay"]), calling=CALLING)
        def call(self, lengths: list[int], mode: str, all_logits: bool, pad: int, via: str, calling: str) -> None:
            self._call_rule(self._batch(lengths, mode, all_logits, pad), via, calling)

        @rule(lengths=_lengths(), extra=st.integers(1, 4), mode=st.sampled_from(["none", "last", "full"]),
              all_logits=st.booleans(), pad=st.integers(0, 3), via=st.sampled_from(["run", "replay"]), calling=CALLING)
        def call_with_padding_requests(self, lengths: list[int], extra: int, mode: str, all_logits: bool, pad: int,
                                       via: str, calling: str) -> None:
            # A scheduler pads a batch's request count to a captured size with requests that have no tokens
            # (vLLM #49302): one output row per request, padding requests included, as eager gives.
            self._call_rule(self._batch(lengths, mode, all_logits, pad, padding_requests=extra), via, calling)

        def _call_rule(self, batch: ForwardBatch, via: str, calling: str) -> None:
            what = self._describe(batch, via, calling)
            replayable = self._replayable(batch)
            assert self.runner.can_run(batch) == replayable, f"can_run is {not replayable} for {what}"
            if via == "replay" and not replayable:
                with calling_mode(calling), \
                        pytest.raises(BucketError if batch.num_tokens + batch.num_padding > MAX else HarnessError):
                    self._call(via, batch)
                return
            self._checked(via, batch, what, calling=calling)
            if replayable:
                self.expected_replays += 1
            else:
                self.expected_fallbacks += 1

        @rule(lengths=_lengths(MAX), where=st.sampled_from(["outer forward", "eager break"]),
              error=st.sampled_from(sorted(EXCEPTIONS)), via=st.sampled_from(["run", "replay"]))
        def raise_half_way(self, lengths: list[int], where: str, error: str, via: str) -> None:
            batch = self._batch(lengths if not fell_back else [sum(lengths)], "none", False, 0)
            exception = EXCEPTIONS[error]

            def fail() -> None:
                raise exception(f"raised from the {where}")

            hooks = self.subject.hooks

            def raising_call() -> None:
                if where == "outer forward":
                    hooks.after_forward = fail
                try:
                    with pytest.raises(exception):
                        self._call(via, batch, in_break=fail if where != "outer forward" else None)
                finally:
                    hooks.after_forward = None

            # A call that raises leaves the process and the model as eager raising from the same place would: as
            # it found them.
            checker.construct(raising_call, modules=[self.model], what=f"{via} raising {error} from the {where}",
                              machine=kind, batch=batch.describe())
            self.unsure += 1
            self.disturbed = True

        @rule(outer=_lengths(MAX), outer_via=st.sampled_from(["run", "replay"]),
              attempts=st.permutations([(via, size) for via in ("run", "replay") for size in ("same bucket", "other")]),
              calling=CALLING)
        def nested_call(self, outer: list[int], outer_via: str, attempts: list[tuple[str, str]], calling: str) -> None:
            # Every kind of nested call in each such step (run and replay, at the outer bucket's size and at
            # another), in a drawn order: the clause is checked whole however often the rule is drawn.
            outer_batch = self._batch(outer if not fell_back else [sum(outer)], "none", False, 0)
            bucket = select_bucket(outer_batch.num_tokens, BUCKETS)
            inner = {size: self._batch([bucket if size == "same bucket" else (1 if bucket > 2 else MAX)], "none",
                                       False, 0) for size in ("same bucket", "other")}
            seen: list[tuple[str, BaseException | None]] = []

            def nested() -> None:
                for via, size in attempts:
                    what = f"{via} of {inner[size].num_tokens} tokens"
                    try:
                        self._call(via, inner[size])
                    except BaseException as error:  # noqa: BLE001 - recorded and judged below
                        seen.append((what, error))
                    else:
                        seen.append((what, None))

            what = (f"{outer_via} of {outer_batch.describe()} with {[f'{v} at {s}' for v, s in attempts]} nested "
                    "inside, in that order")
            self._checked(outer_via, outer_batch, what, calling=calling, in_break=nested)
            wrong = [(inner_what, error) for inner_what, error in seen if not isinstance(error, ReplayError)]
            assert len(seen) == len(attempts) and not wrong, (
                f"{what}: every nested call must raise ReplayError (the outer replay's forward is patched and its "
                f"static buffers are in use); these did not: {wrong}")
            self.expected_replays += 1
            self.disturbed = True

        @rule(lengths=_lengths(MAX), twin_lengths=_lengths(MAX), via=st.sampled_from(["run", "replay"]),
              calling=CALLING)
        def twin_runs_during_replay(self, lengths: list[int], twin_lengths: list[int], via: str, calling: str) -> None:
            batch = self._batch(lengths if not fell_back else [sum(lengths)], "none", False, 0)
            twin_batch = self._batch(twin_lengths, "full", True, 0)
            twin = self.subject.twin
            expected = eager(twin, twin_batch)
            seen: list[Any] = []

            def run_twin() -> None:
                try:
                    seen.append(eager(twin, twin_batch))
                except Exception as error:  # noqa: BLE001 - judged below
                    seen.append(error)

            what = f"{via} of {batch.describe()} while a second {type(twin).__name__} ran {twin_batch.describe()}"
            self._checked(via, batch, what, calling=calling, in_break=run_twin)
            assert len(seen) == 1 and not isinstance(seen[0], Exception), f"{what}: the second instance raised {seen}"
            assert_equivalent(seen[0], expected, exact=True,
                              context=context(machine=kind, call=what, comparison="second instance, eager, inside a "
                                              "replay vs outside it (the patch must be on the runner's instance only)"))
            self.expected_replays += 1

        @rule(install=st.booleans())
        def change_forward_wrapper(self, install: bool) -> None:
            # Between calls the user wraps the layer's forward (a profiler) or takes the wrapper off: the runner
            # puts back what is there at each call, not what it found when it was built.
            layer, hooks = self.subject.layer, self.subject.hooks
            if install:
                inner = layer.forward

                def counting_forward(*args: Any, **kwargs: Any) -> Any:
                    hooks.wrapper_calls += 1
                    return inner(*args, **kwargs)

                layer.forward = counting_forward
            else:
                layer.__dict__.pop("forward", None)
            self.instance_dict = dict(layer.__dict__)

        @rule(seed=st.integers(0, 2**16))
        def update_weights_in_place(self, seed: int) -> None:
            # An RL weight sync or a LoRA swap writes new values into the parameters, and the graphs are not
            # captured again: replays must read the parameters themselves.
            generator = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for name, parameter in self.model.named_parameters():
                    noise = torch.randn(parameter.shape, generator=generator).to(parameter.device, parameter.dtype)
                    parameter.copy_(self.subject.weights[name] * (1 + 0.1 * noise))

        @rule()
        def move_weights(self) -> None:
            # An engine's memory release and resume (a pause for RL training) re-allocates the parameters: the same
            # values in new memory. A graph reads the memory it was captured on, so the runner must capture again
            # before it replays (moved-state); the weight updates after this step show whether it did.
            with torch.no_grad():
                for parameter in self.model.parameters():
                    parameter.data = parameter.data.clone()
            self.subject.moves += 1

        def teardown(self) -> None:
            if hasattr(self, "subject"):
                self.subject.reset()

        # -- invariants -----------------------------------------------------------------------

        @invariant()
        def handed_out_outputs_keep_their_values(self) -> None:
            # Each was eager's when handed out (check_run); it must stay what it was, bit for bit.
            for output, value, what in self.kept:
                assert_equivalent(output, value, exact=True,
                                  context=context(machine=kind, call=what, comparison="an output handed out earlier, "
                                                  "read after every later step"))

        @invariant()
        def layer_module_is_as_before(self) -> None:
            layer = self.subject.layer
            _same_dict(layer.__dict__, self.instance_dict, f"the {type(layer).__name__} instance's __dict__")
            _same_dict(dict(type(layer).__dict__), self.subject.class_dict, f"{type(layer).__name__}.__dict__")

        @invariant()
        def no_forward_context_left(self) -> None:
            assert published_batch() is None, f"a forward context is still published: {published_batch()!r}"

        @invariant()
        def counters_add_up(self) -> None:
            stats = self.runner.stats
            base_replays, base_fallbacks, base_buckets = self.base
            replays, fallbacks = stats.replays - base_replays, stats.eager_fallbacks - base_fallbacks
            # A capture per bucket when built, and again at most once per move of the weights (in any example on
            # this cached model: a move stays, and the next replay, maybe the next example's, captures again).
            moves = self.subject.moves
            buckets = len(BUCKETS)
            assert stats.captures % buckets == 0 and buckets <= stats.captures <= buckets * (1 + moves), (
                f"{stats.captures} captures for buckets {BUCKETS} after {moves} moves of the weights")
            assert sum(stats.replays_by_bucket.values()) == stats.replays, (
                f"replays by bucket {stats.replays_by_bucket} do not add up to {stats.replays} replays")
            low = (self.expected_replays, self.expected_fallbacks)
            assert low[0] <= replays and low[1] <= fallbacks and replays + fallbacks <= sum(low) + self.unsure, (
                f"since this machine started: {replays} replays and {fallbacks} eager fallbacks counted; expected "
                f"{low[0]} and {low[1]}, plus at most {self.unsure} calls that raised half-way")

        @invariant()
        def runner_remains_usable(self) -> None:
            # Every rule uses the runner; after a step that raised or nested, a replay proves it still works.
            if not self.disturbed:
                return
            self.disturbed = False
            batch = self._batch([1], "none", False, 0)
            self.expected_replays += 1
            self._checked("replay", batch, "the usability probe replay(1 token)")

    return RunnerLifecycle


@pytest.mark.parametrize("kind", list(MACHINES))
def test_runner_lifecycle(kind, build_runner, device, check_run, runner_checker, failure_context):
    cache: dict[tuple[bool, bool, str], _Subject] = {}

    def subjects(wrapper: bool, hook: bool) -> _Subject:
        key = (wrapper, hook, context_key("runner"))  # one subject per caller's context (harness.oracle.context_key)
        if key not in cache:
            cache[key] = _build_subject(kind, wrapper, hook, build_runner, device)
        return cache[key]

    machine = _machine(kind, subjects, device, check_run, runner_checker, failure_context)
    current = settings()
    # Each example captures a model (cached per wrapper/hook combination); half the profile's examples of
    # ten steps each keep both machines inside the ci budget.
    run_state_machine_as_test(machine, settings=settings(current, max_examples=max(current.max_examples // 2, 1),
                                                         stateful_step_count=10))
