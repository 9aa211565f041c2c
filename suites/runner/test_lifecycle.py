"""Lifecycle: the layer forward is put back after success, an exception and a BaseException; a
replay inside a replay raises; replay never calls the real layer forward and calls the logits
processor once; outputs handed out survive the next replay; a batch no bucket holds is refused."""

from __future__ import annotations

import pytest
import torch

from harness.errors import BucketError, ReplayError
from harness.models import build_model
from harness.oracle import CALLING_MODES, calling_mode
from harness.runner.cases import BUCKETS, SEED, make_batch

pytestmark = pytest.mark.clause("forward-restored")


class _Abort(BaseException):
    """Stands for KeyboardInterrupt or SystemExit arriving in the middle of a forward."""


def _assert_forward_restored(layer: torch.nn.Module, when: str) -> None:
    forward = layer.forward
    assert getattr(forward, "__func__", None) is type(layer).forward and forward.__self__ is layer, (
        f"layer_model.forward is still {forward!r} {when}; expected the original {type(layer).__name__}.forward")


def _batch(device, lengths=(3, 5), seed=11, mode="full"):
    return make_batch("dense", list(lengths), seed=seed, dtype=torch.float32, device=device, hidden_mode=mode)


def test_forward_restored_after_success(zoo_runner, check_run, device):
    model, runner = zoo_runner("dense")
    check_run(runner, model, _batch(device), model="dense", seed=11)
    _assert_forward_restored(runner.discovery.module, "after a successful replay")


@pytest.mark.parametrize("error", [RuntimeError("logits processor failed"), _Abort()],
                         ids=["Exception", "BaseException"])
def test_forward_restored_after_an_error_and_runner_still_usable(zoo_runner, check_run, runner_checker, device,
                                                                 monkeypatch, error):
    model, runner = zoo_runner("dense")

    def failing(*args, **kwargs):
        raise error

    def raising_run():
        with pytest.raises(type(error)):
            runner.run(_batch(device))

    with monkeypatch.context() as patch:
        patch.setattr(model.logits_processor, "forward", failing)
        # it leaves the process and the model as it found them, as eager raising from the same place would
        runner_checker.construct(raising_run, modules=[model], what=f"run raising {type(error).__name__}")
    _assert_forward_restored(runner.discovery.module, f"after {type(error).__name__} in the outer forward")
    check_run(runner, model, _batch(device, seed=12), model="dense", seed=12)


@pytest.mark.clause("not-reentrant")
def test_replay_inside_a_replay_raises(zoo_runner, check_run, runner_checker, device, monkeypatch):
    model, runner = zoo_runner("dense")
    original = model.logits_processor.forward
    inner = _batch(device, lengths=(2,), seed=13)

    def nested(hidden, batch):
        runner.run(inner)
        return original(hidden, batch)

    def refused_run():
        with pytest.raises(ReplayError):
            runner.run(_batch(device))

    with monkeypatch.context() as patch:
        patch.setattr(model.logits_processor, "forward", nested)
        runner_checker.construct(refused_run, modules=[model], what="run refusing a run nested inside it")
    _assert_forward_restored(runner.discovery.module, "after a nested replay was refused")
    check_run(runner, model, inner, model="dense", seed=13)


@pytest.mark.clause("runs-once")
def test_replay_skips_the_layer_forward_and_runs_the_logits_processor_once(zoo_runner, check_run, device, monkeypatch):
    model, runner = zoo_runner("dense")
    layer = runner.discovery.module
    calls = {"layer": 0, "logits": 0, "counting": False}
    real_layer_forward, real_logits = type(layer).forward, model.logits_processor.forward

    def spy_layer(self, *args, **kwargs):
        calls["layer"] += calls["counting"]
        return real_layer_forward(self, *args, **kwargs)

    def spy_logits(*args, **kwargs):
        calls["logits"] += calls["counting"]
        return real_logits(*args, **kwargs)

    monkeypatch.setattr(type(layer), "forward", spy_layer)
    monkeypatch.setattr(model.logits_processor, "forward", spy_logits)
    def counted_run(batch):  # the spies count inside the runner's call only, not in the eager oracles around it
        calls["counting"] = True
        try:
            return runner.run(batch)
        finally:
            calls["counting"] = False

    replays = runner.stats.replays
    check_run(runner, model, _batch(device, lengths=(4, 1, 2)), via=counted_run, model="dense", seed=11)
    assert runner.stats.replays == replays + 1, "the batch did not replay"
    del calls["counting"]
    assert calls == {"layer": 0, "logits": 1}, f"at replay: {calls} (the real layer forward must not run; logits once)"


@pytest.mark.clause("outputs-owned")
def test_outputs_survive_the_next_replay(zoo_runner, check_run, device):
    # The checker keeps the first call's results and checks the second call (same bucket: its graph writes the
    # same static buffers) leaves them alone.
    model, runner = zoo_runner("dense")
    for lengths, seed in (([3, 4], 21), ([6, 1], 22)):
        batch = make_batch("dense", lengths, seed=seed, dtype=torch.float32, device=device, hidden_mode="full",
                           all_logits=True)
        check_run(runner, model, batch, model="dense", seed=seed)


@pytest.mark.clause("bucket-errors")
def test_a_batch_no_bucket_holds_is_refused(build_runner, device):
    model = build_model("dense", seed=SEED, device=device)
    runner = build_runner(model, buckets=(4, 8))
    assert runner.stats.captures == 2, f"two buckets, {runner.stats.captures} captures"
    batch = _batch(device, lengths=(5, 4))
    assert not runner.can_run(batch)
    with pytest.raises(BucketError, match="9"):
        runner.replay(batch)


@pytest.mark.clause("bucket-errors")
@pytest.mark.parametrize("buckets", [(), (8, 0), (4, 4)], ids=["none", "zero", "repeated"])
def test_bad_buckets_are_refused(build_runner, device, buckets):
    model = build_model("dense", seed=SEED, device=device)
    with pytest.raises(BucketError):
        build_runner(model, buckets=buckets)


@pytest.mark.clause("accounting")
def test_counters_start_from_the_capture(zoo_runner):
    _, runner = zoo_runner("dense")
    assert runner.stats.captures == len(BUCKETS)


@pytest.mark.clause("buckets-and-padding")
def test_a_batch_arriving_padded_between_buckets_replays_in_the_bucket_holding_its_rows(zoo_runner, check_run, device):
    # 3 real tokens padded to 5 rows: bucket 4 holds the tokens but not the rows; bucket 8 holds both.
    model, runner = zoo_runner("dense")
    batch = _batch(device, lengths=(1, 2), seed=31).padded_to(5)
    assert runner.can_run(batch), "a pre-padded batch whose rows fit bucket 8 must be runnable"
    before = runner.stats.replays_by_bucket.get(8, 0)
    # The oracles: eager on the batch as it arrived, and eager at the replay's shapes (bucket 8, from the batch's
    # own 5 rows), both cut to the real tokens.
    actual = check_run(runner, model, batch, model="dense", seed=31)
    assert runner.stats.replays_by_bucket.get(8, 0) == before + 1, (
        f"{batch.describe()} should replay bucket 8: {runner.stats.replays_by_bucket}")
    assert actual.hidden_states.shape[0] == 3, "per-token outputs are cut to the real tokens, not the rows"


@pytest.mark.clause("no-grad")
@pytest.mark.parametrize("built_in", CALLING_MODES)
def test_the_callers_inference_mode_at_construction_and_at_every_call(build_runner, check_run, device, built_in):
    """Engines build runners and serve under ``torch.inference_mode()`` or ``no_grad``, not always the same: a
    runner built in one works in each. Outputs are eager's under the caller's mode (the checker compares their
    autograd history and inference flag with eager's): a caller outside inference mode gets normal tensors,
    which it may update in place (samplers scale logits in place)."""
    model = build_model("dense", seed=SEED, device=device, requires_grad=True)
    with calling_mode(built_in):
        runner = build_runner(model, buckets=(4, 8))
    for call_in in CALLING_MODES:
        for lengths in ((3, 5), (6, 4)):  # bucket 8, and past the largest bucket
            batch = _batch(device, lengths=lengths, seed=len(call_in))
            check_run(runner, model, batch, mode=call_in, buckets=(4, 8), model="dense", built_in=built_in)
