"""The speculative-decode loop: the runner and the gather together, as an overlap scheduler runs them.

A target model (paged KV cache) verifies draft tokens through the runner under test with hidden mode
``full`` or ``last`` (or ``none``, where the draft uses no hidden states and the relay keeps no
hidden-states buffer); the step's extras go through the FutureMap relay, resolved at the next step
by the gather under test; a draft head proposes from them. The loop must equal its eager twin (the
same target weights with their own cache, the eager gather) after every step: the batch it sends,
its logits and hidden states, the accepted tokens, the whole relay, the KV cache. Bitwise where
:func:`harness.compare.bitwise_expected` holds, else within the tolerance table with the twin
following the runner's drafts and choices (each must then be an eager near-argmax).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.compare import ComputeSettings, assert_equivalent, tolerance_for
from harness.gather import SpecExtrasRelay, eager_gather
from harness.models import build_model
from harness.oracle import CALLING_MODES
from harness.runner.cases import CONFIG, SEED, TwinSteps, eager_forward, stateless_parts
from harness.runner.decode import DecodePlan, DecodeRequest
from harness.runner.speculative import DraftHead, SpeculativeLoop

pytestmark = pytest.mark.clause("decode-steps")

NUM_PAGES, BLOCK_SIZE, POOL, TOPK = 24, 4, 6, 4


@st.composite
def spec_plans(draw) -> DecodePlan:
    """1-3 requests, prompts of 1-6 tokens, 1-5 new tokens, joining at steps 0-2 (at most 18 tokens a
    step: every step replays). Small, so the ci profile stays within its budget."""
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    requests = []
    for _ in range(draw(st.integers(1, 3))):
        prompt = torch.randint(0, CONFIG.vocab_size, (draw(st.integers(1, 6)),), generator=generator)
        requests.append(DecodeRequest(tuple(prompt.tolist()), draw(st.integers(1, 5)), draw(st.integers(0, 2))))
    return DecodePlan(tuple(requests), NUM_PAGES, BLOCK_SIZE)


@pytest.fixture(scope="module")
def twin(device):
    """The eager twin: the same target weights, its own KV cache."""
    return build_model("paged-decoder", seed=SEED, device=device)


@pytest.fixture(scope="module")
def draft_head(twin):
    return DraftHead.for_target(twin, seed=SEED + 1)


def _relay(mode: str, gather, device) -> SpecExtrasRelay:
    return SpecExtrasRelay(POOL, topk=TOPK, hidden_size=None if mode == "none" else CONFIG.hidden_size,
                           hidden_dtype=torch.float32, device=device, gather=gather)


def _relay_buffers(relay: SpecExtrasRelay) -> dict:
    return {"topk_p": relay.topk_p_buf, "topk_index": relay.topk_index_buf,
            "output_tokens": relay.output_tokens_buf, "hidden_states": relay.hidden_states_buf}


def _assert_near_argmax(chosen, logits: torch.Tensor, context: dict, what: str) -> None:
    """Teacher forcing: the runner's choices must be argmaxes of the eager logits within tolerance."""
    tolerance = tolerance_for(torch.float32, device_type=logits.device.type, settings=ComputeSettings.now())
    picked = logits.gather(1, torch.tensor(chosen, device=logits.device)[:, None]).flatten()
    best = logits.max(dim=-1).values
    gap = best - picked
    assert bool((gap <= tolerance.atol + tolerance.rtol * best.abs()).all()), (
        f"{what} {list(chosen)} are not eager near-argmaxes (gaps {gap.tolist()}): {context}")


@given(plan=spec_plans(), mode=st.sampled_from(["full", "last", "none"]), num_draft=st.integers(1, 2),
       calling=st.sampled_from(CALLING_MODES))
def test_speculative_loop_matches_the_eager_twin(zoo_runner, twin, draft_head, gather_function, check_run,
                                                 exact_comparison, failure_context, device, plan, mode, num_draft,
                                                 calling):
    model, runner = zoo_runner("paged-decoder")
    bitwise = exact_comparison(torch.float32)
    model.kv_cache.reset()
    twin.kv_cache.reset()

    # Every verify batch goes through check_run against the eager twin (the same target weights, its own cache);
    # the twin's loop then takes the twin's output for that batch.
    twin_steps = TwinSteps(eager_forward(twin, bitwise=bitwise), plan.describe())

    def checked_run(batch):
        return check_run(runner, model, batch, mode=calling, twin=twin_steps.run, modules=stateless_parts(model),
                         plan=plan.describe(), hidden_mode=mode, num_draft=num_draft, step=ran.step_index)

    ran = SpeculativeLoop(plan, checked_run, draft=draft_head, relay=_relay(mode, gather_function, device),
                          num_draft=num_draft, hidden_mode=mode, device=device)
    followed = SpeculativeLoop(plan, twin_steps.replay, draft=draft_head,
                               relay=_relay(mode, eager_gather, device), num_draft=num_draft, hidden_mode=mode,
                               device=device)
    step = 0
    while not ran.done:
        replays, fallbacks = runner.stats.replays, runner.stats.eager_fallbacks
        actual = ran.step()
        expected = followed.step(force=None if bitwise else actual)
        step += 1
        if actual is None:
            assert expected is None, f"step {step}: the twin had live requests {expected.request_ids}, the loop none"
            continue
        context = failure_context(plan=plan.describe(), hidden_mode=mode, num_draft=num_draft, step=step,
                                  batch=actual.batch.describe(), requests=actual.request_ids, drafts=actual.drafts)
        assert (runner.stats.replays - replays, runner.stats.eager_fallbacks - fallbacks) == (1, 0), (
            f"step {step}: a verify batch must replay exactly once and never fall back; replays "
            f"+{runner.stats.replays - replays}, eager fallbacks +{runner.stats.eager_fallbacks - fallbacks}: "
            f"{context}")
        assert (actual.request_ids, actual.drafts) == (expected.request_ids, expected.drafts), (
            f"step {step}: the loop sent requests {actual.request_ids} with drafts {actual.drafts}, the eager twin "
            f"{expected.request_ids} with {expected.drafts} (drafts come from the relay the gather resolved): "
            f"{context}")
        assert torch.equal(actual.batch.input_ids, expected.batch.input_ids), (
            f"step {step}: verify tokens differ: {context}")
        assert_equivalent((model.kv_cache.keys, model.kv_cache.values), (twin.kv_cache.keys, twin.kv_cache.values),
                          exact=bitwise, context={**context, "compared": "the whole KV cache (keys, values)"})
        if bitwise:
            assert (actual.targets, actual.appended) == (expected.targets, expected.appended), (
                f"step {step}: target choices {actual.targets} / accepted {actual.appended} vs eager "
                f"{expected.targets} / {expected.appended}: {context}")
            assert_equivalent(_relay_buffers(ran.relay), _relay_buffers(followed.relay), exact=True,
                              context={**context, "compared": "relay buffers after the step's stash"})
        else:
            chosen = [t for targets in actual.targets for t in targets]
            _assert_near_argmax(chosen, expected.logits, context, f"step {step}: target choices")
            candidate, oracle = _relay_buffers(ran.relay), _relay_buffers(followed.relay)
            assert torch.equal(candidate["output_tokens"], oracle["output_tokens"]), (
                f"step {step}: bonus tokens: {context}")
            assert_equivalent((candidate["topk_p"], candidate["hidden_states"]),
                              (oracle["topk_p"], oracle["hidden_states"]), exact=False,
                              context={**context, "compared": "relay (topk_p, hidden_states)"})
            # Top-k ids may swap only between near-equal probabilities.
            swapped = candidate["topk_index"] != oracle["topk_index"]
            gap = (candidate["topk_p"] - oracle["topk_p"]).abs()[swapped]
            atol = tolerance_for(torch.float32, device_type=gap.device.type, settings=ComputeSettings.now()).atol
            assert bool((gap <= atol * 10).all()), f"step {step}: top-k ids differ: {context}"
        assert ran.relay.pending_slots() == followed.relay.pending_slots(), f"step {step}: pending slots: {context}"
    assert ran.tokens == followed.tokens, f"token streams differ: {ran.tokens} vs {followed.tokens}"
    assert ran.relay.pending_slots() == [], (
        f"slots left stashed after every request finished: {ran.relay.pending_slots()}")


def test_the_draft_reads_the_hidden_states_it_is_given(twin, draft_head, device):
    """The loop would be blind to hidden-state bugs if the draft ignored them: closed-form check."""
    tokens = torch.tensor([3, 5], device=device)
    hidden = torch.randn(2, CONFIG.hidden_size, generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        with_hidden, _ = draft_head(hidden, tokens)
        without, _ = draft_head(None, tokens)
        zeros, _ = draft_head(torch.zeros_like(hidden), tokens)
    assert torch.equal(without, zeros), "hidden=None must read as zeros"
    assert not torch.allclose(with_hidden, without), "the draft's logits do not depend on the hidden states"
