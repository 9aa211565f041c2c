"""Multi-step greedy decode with a paged KV cache: requests join, finish and leave between steps and
their cache pages are reused. After every step the runner's token streams, logits and cache contents
equal an eager twin's (same model, own cache): bitwise where the backend allows it, else within the
tolerance table with the twin following the runner's tokens (each must be an eager near-argmax). Every step
goes through ``check_run`` against the twin, under a drawn calling mode."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.compare import ComputeSettings, assert_equivalent, tolerance_for
from harness.models import build_model
from harness.oracle import CALLING_MODES
from harness.runner.cases import CONFIG, SEED, TwinSteps, eager_forward, stateless_parts
from harness.runner.decode import DecodeLoop, DecodePlan, DecodeRequest

pytestmark = pytest.mark.clause("decode-steps")

NUM_PAGES, BLOCK_SIZE = 24, 4


@st.composite
def plans(draw) -> DecodePlan:
    """1-4 requests, prompts of 1-6 tokens, 1-5 new tokens, joining at steps 0-4 (at most 24 tokens
    a step: every step replays)."""
    count = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    requests = []
    for _ in range(count):
        length = draw(st.integers(1, 6))
        prompt = tuple(torch.randint(0, CONFIG.vocab_size, (length,), generator=generator).tolist())
        requests.append(DecodeRequest(prompt, draw(st.integers(1, 5)), draw(st.integers(0, 4))))
    return DecodePlan(tuple(requests), NUM_PAGES, BLOCK_SIZE)


@pytest.fixture(scope="module")
def twin(device):
    """The eager twin: the same weights, its own KV cache."""
    return build_model("paged-decoder", seed=SEED, device=device)


@given(plan=plans(), calling=st.sampled_from(CALLING_MODES))
def test_decode_steps_match_the_eager_twin(zoo_runner, twin, check_run, exact_comparison, failure_context, device,
                                           plan, calling):
    model, runner = zoo_runner("paged-decoder")
    bitwise = exact_comparison(torch.float32)
    model.kv_cache.reset()
    twin.kv_cache.reset()

    # Every runner call goes through check_run against the eager twin (the same weights, its own cache); the twin's
    # loop then takes the twin's output for that batch.
    twin_steps = TwinSteps(eager_forward(twin, bitwise=bitwise), plan.describe())

    def checked_run(batch):
        return check_run(runner, model, batch, mode=calling, twin=twin_steps.run, modules=stateless_parts(model),
                         plan=plan.describe(), step=ran.step_index)

    ran = DecodeLoop(plan, checked_run, device=device)
    followed = DecodeLoop(plan, twin_steps.replay, device=device)
    step = 0
    while not ran.done:
        writes = (model.kv_cache.writes, twin.kv_cache.writes)
        replays = runner.stats.replays
        actual = ran.step()
        expected = followed.step(force_tokens=None if bitwise else (actual.tokens if actual else None))
        step += 1
        if actual is None:
            assert expected is None
            continue
        context = failure_context(plan=plan.describe(), step=step, batch=actual.batch.describe(),
                                  requests=actual.request_ids)
        assert runner.stats.replays == replays + 1, f"step {step} did not replay exactly once: {context}"
        layers = CONFIG.num_layers
        assert (model.kv_cache.writes - writes[0], twin.kv_cache.writes - writes[1]) == (layers, layers), (
            f"step {step}: each layer writes the cache once per forward; runner wrote "
            f"{model.kv_cache.writes - writes[0]} times, eager {twin.kv_cache.writes - writes[1]}: {context}")
        assert actual.request_ids == expected.request_ids
        assert_equivalent((model.kv_cache.keys, model.kv_cache.values), (twin.kv_cache.keys, twin.kv_cache.values),
                          exact=bitwise, context={**context, "compared": "the whole KV cache (keys, values)"})
        if bitwise:
            assert actual.tokens == expected.tokens, f"step {step}: tokens {actual.tokens} vs eager {expected.tokens}"
        else:
            tolerance = tolerance_for(torch.float32, device_type=device.type, settings=ComputeSettings.now())
            picked = expected.logits.gather(1, torch.tensor(actual.tokens, device=device)[:, None]).flatten()
            best = expected.logits.max(dim=-1).values
            gap = best - picked
            assert bool((gap <= tolerance.atol + tolerance.rtol * best.abs()).all()), (
                f"step {step}: runner tokens are not eager near-argmax ({gap}): {context}")
    assert ran.tokens == followed.tokens
