"""What the outer model hands the layer stack, and what the stack hands back, changing between calls.

The runner copies the live arguments of the stack's call into the static ones; everything it could
wrongly freeze changes here from call to call, each on a model whose outer forward passes it the way
engines do:

* ``shifted-positions``: the outer model offsets the positions it passes, and the stack adds a learned
  table of absolute positions (OPT): the stack's arguments are the call's, not the batch's fields. The
  table matters: rotary attention sees only the distance between positions, so a shift of every position
  changes a rotary stack's output by rounding alone, which a tolerance comparison (CUDA) cannot see.
* ``deepstack-list``: a keyword holding a list of per-layer tensors (Qwen3-VL's DeepStack embeddings):
  container members are inputs too.
* ``optional-embeds``: ``input_embeds`` is ``None`` for text-only batches (the dummy capture batch among
  them) and a tensor when the batch carries image embeddings.
* ``draft-step``: a Python ``int`` keyword that picks how many layers run (an MTP draft step index, set on
  the model between calls).
* ``float-scale``: a Python ``float`` keyword the stack multiplies by (a logit scale set between calls), drawn at
  the float edges, NaN and infinities among them: a value other than the capture's (bit for bit: NaN is the same
  NaN, -0.0 is not 0.0) must be refused, never replayed as the capture's.
* ``aux-hidden``: the stack returns ``(hidden, [aux, ...])`` and the model hands out a dict with the
  auxiliary hidden states (EAGLE-3): every output structure is cut to the real tokens and copied.

After every call: a replay equals eager (bitwise at the replay's shapes where the backend allows), or,
for an argument the graph cannot follow (a Python value other than the capture's, a tensor where the
capture saw ``None``), the runner raises a :class:`~harness.errors.HarnessError` instead; never a silent
replay of the capture's value. Every output handed out earlier keeps its value.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.batch import ForwardBatch, forward_context, select_bucket
from harness.compare import assert_equivalent
from harness.conformance.plugin import PerTestInConformance
from harness.errors import HarnessError, MismatchError
from harness.models import build_model
from harness.models.engine import CausalLM, EngineModel, ModelConfig
from harness.oracle import CALLING_MODES, context_key
from harness.runner.cases import SEED, split_strategy
from harness.runner.runner import map_tensors

pytestmark = pytest.mark.clause("stack-arguments")

BUCKETS = (4, 8)
CONFIG = ModelConfig()


class _ShiftedPositionsLM(CausalLM):
    offset = 2

    def forward(self, input_ids, positions, batch, input_embeds=None):
        with forward_context(batch):
            return self.logits_processor(self.model(input_ids, positions + self.offset, batch, input_embeds), batch)


class _LearnedPositionsStack(EngineModel):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        # Every position a call can pass (a request holds at most the largest bucket's tokens), shifted.
        table = torch.randn(BUCKETS[-1] + _ShiftedPositionsLM.offset, config.hidden_size,
                            generator=torch.Generator().manual_seed(SEED))
        self.embed_positions = torch.nn.Embedding.from_pretrained(table)

    def forward(self, input_ids, positions, batch, input_embeds=None):
        hidden = self.embed(input_ids, input_embeds) + self.embed_positions(positions)
        for layer in self.decoder_layers:
            hidden = layer(positions, hidden)
        return self.norm(hidden)


class _DeepStack(EngineModel):
    def forward(self, input_ids, positions, batch, input_embeds=None, *, deepstack_embeds=()):
        hidden = self.embed(input_ids, input_embeds)
        for index, layer in enumerate(self.decoder_layers):
            hidden = layer(positions, hidden)
            if index < len(deepstack_embeds):
                hidden = hidden + deepstack_embeds[index]
        return self.norm(hidden)


class _DeepStackListLM(CausalLM):
    def forward(self, input_ids, positions, batch, input_embeds=None):
        tokens = input_ids.shape[0]
        given = batch.side_inputs.get("deepstack")
        embeds = [given[:, i] if given is not None else
                  torch.zeros(tokens, CONFIG.hidden_size, dtype=self.lm_head.weight.dtype, device=input_ids.device)
                  for i in range(CONFIG.num_layers)]
        with forward_context(batch):
            return self.logits_processor(self.model(input_ids, positions, batch, input_embeds,
                                                    deepstack_embeds=embeds), batch)


class _OptionalEmbedsLM(CausalLM):
    def forward(self, input_ids, positions, batch, input_embeds=None):
        images = batch.side_inputs.get("image_embeds")
        if images is not None:  # text-only batches pass None, as the dummy capture batch does
            input_embeds = self.model.embed_tokens(input_ids) + images
        with forward_context(batch):
            return self.logits_processor(self.model(input_ids, positions, batch, input_embeds), batch)


class _EarlyExitStack(EngineModel):
    def forward(self, input_ids, positions, batch, input_embeds=None, *, draft_step=0):
        hidden = self.embed(input_ids, input_embeds)
        for layer in list(self.decoder_layers)[:1 + draft_step % len(self.decoder_layers)]:
            hidden = layer(positions, hidden)
        return self.norm(hidden)


class _DraftStepLM(CausalLM):
    draft_step = 0  # set between calls, as a speculative proposer steps through its draft positions

    def forward(self, input_ids, positions, batch, input_embeds=None):
        with forward_context(batch):
            hidden = self.model(input_ids, positions, batch, input_embeds, draft_step=self.draft_step)
            return self.logits_processor(hidden, batch)


class _ScaledStack(EngineModel):
    def forward(self, input_ids, positions, batch, input_embeds=None, *, scale=1.0):
        hidden = self.embed(input_ids, input_embeds)
        for layer in self.decoder_layers:
            hidden = layer(positions, hidden)
        return self.norm(hidden) * scale


class _FloatScaleLM(CausalLM):
    scale = 1.0  # set between calls; the runner was built (and captured) at 1.0

    def forward(self, input_ids, positions, batch, input_embeds=None):
        with forward_context(batch):
            return self.logits_processor(self.model(input_ids, positions, batch, input_embeds, scale=self.scale),
                                         batch)


# A float keyword's values: the capture's, another, both zeros, the infinities and NaN.
SCALES = (1.0, 0.5, 0.0, -0.0, float("inf"), float("-inf"), float("nan"))


class _AuxStack(EngineModel):
    def forward(self, input_ids, positions, batch, input_embeds=None):
        hidden = self.embed(input_ids, input_embeds)
        aux = []
        for layer in self.decoder_layers:
            hidden = layer(positions, hidden)
            aux.append(hidden)
        return self.norm(hidden), aux


class _AuxHiddenLM(CausalLM):
    def forward(self, input_ids, positions, batch, input_embeds=None):
        with forward_context(batch):
            hidden, aux = self.model(input_ids, positions, batch, input_embeds)
            return {"logits": self.logits_processor(hidden, batch), "aux_hidden_states": tuple(aux)}


MODELS = {
    "shifted-positions": lambda: _ShiftedPositionsLM(CONFIG, _LearnedPositionsStack(CONFIG)),
    "deepstack-list": lambda: _DeepStackListLM(CONFIG, _DeepStack(CONFIG)),
    "optional-embeds": lambda: _OptionalEmbedsLM(CONFIG),
    "draft-step": lambda: _DraftStepLM(CONFIG, _EarlyExitStack(CONFIG)),
    "aux-hidden": lambda: _AuxHiddenLM(CONFIG, _AuxStack(CONFIG)),
    "float-scale": lambda: _FloatScaleLM(CONFIG, _ScaledStack(CONFIG)),
}


def _build(name: str, device: torch.device) -> torch.nn.Module:
    # The zoo's dense weights (same parameter names; a stack's own extra tables kept), in eval mode without grad.
    reference = build_model("dense", seed=SEED, device=device)
    model = MODELS[name]().to(device)
    model.load_state_dict({**model.state_dict(), **reference.state_dict()})
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def argument_runners(build_runner, device):
    cache = PerTestInConformance()  # shared by the module's tests, except in a conformance run

    def get(name: str) -> tuple[torch.nn.Module, Any]:
        def build() -> tuple[torch.nn.Module, Any]:
            model = _build(name, device)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return model, build_runner(model, buckets=BUCKETS)

        return cache.get((name, context_key("runner")), build)  # one runner per caller's context

    return get


def _call(draw: Any, name: str, model: torch.nn.Module, seed: int, device: torch.device) -> tuple[ForwardBatch, bool]:
    """A batch for ``name`` (and the model's per-call state); whether the graph can follow it as captured."""
    total = draw(st.one_of(st.sampled_from(BUCKETS), st.integers(1, BUCKETS[-1])), label="tokens")
    lengths = draw(split_strategy(total), label="lengths")
    mode = draw(st.sampled_from(["none", "last", "full"]), label="hidden mode")
    batch = ForwardBatch.from_lengths(lengths, vocab_size=CONFIG.vocab_size, seed=seed, device=device,
                                      hidden_mode=mode, all_logits=draw(st.booleans(), label="all logits"))
    generator = torch.Generator().manual_seed(seed)
    dtype = model.lm_head.weight.dtype
    if name == "deepstack-list":
        side = torch.randn(batch.num_tokens, CONFIG.num_layers, CONFIG.hidden_size, generator=generator)
        return batch.with_side_inputs(deepstack=side.to(device=device, dtype=dtype)), True
    if name == "optional-embeds" and draw(st.booleans(), label="with images"):
        side = torch.randn(batch.num_tokens, CONFIG.hidden_size, generator=generator)
        return batch.with_side_inputs(image_embeds=side.to(device=device, dtype=dtype)), False
    if name == "draft-step":
        model.draft_step = draw(st.integers(0, CONFIG.num_layers - 1), label="draft step")
        return batch, model.draft_step == 0  # the runner was built (and captured) at draft step 0
    if name == "float-scale":
        model.scale = draw(st.sampled_from(SCALES), label="scale")
        return batch, repr(model.scale) == repr(1.0)  # captured at 1.0; repr tells -0.0 from 0.0
    return batch, True


# The models whose calls change something other than the stack's arguments (the module's clause): a value the
# graph froze, or the structure of what the model hands out.
CLAUSE_OF = {"optional-embeds": "frozen-arguments", "draft-step": "frozen-arguments", "float-scale": "frozen-arguments",
             "aux-hidden": "outputs-owned"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.clause(CLAUSE_OF[name]) if name in CLAUSE_OF
                                               else ()) for name in MODELS])
@given(data=st.data())
def test_every_argument_and_output_follows_the_live_call(argument_runners, check_run, failure_context, device, name,
                                                         data):
    model, runner = argument_runners(name)
    kept: list[tuple[Any, Any, str]] = []
    try:
        for step in range(3):
            seed = data.draw(st.integers(0, 2**16), label="seed")
            batch, as_captured = _call(data.draw, name, model, seed, device)
            calling = data.draw(st.sampled_from(CALLING_MODES), label="calling mode")
            bucket = select_bucket(batch.num_tokens, BUCKETS)
            what = (f"call {step}: {batch.describe()}"
                    + (f", draft step {model.draft_step}" if name == "draft-step" else "")
                    + (f", scale {model.scale!r}" if name == "float-scale" else ""))
            context = failure_context(model=name, seed=seed, call=what)
            replays = runner.stats.replays
            try:
                # As captured: a replay, equal to eager (bitwise at the replay's shapes where the backend allows).
                # Otherwise the runner may run it eagerly instead (values within the tolerance table) or refuse it.
                actual = check_run(runner, model, batch, mode=calling, buckets=BUCKETS,
                                   replayed=True if as_captured else "either", model=name, seed=seed, call=what)
            except MismatchError:
                raise
            except HarnessError as error:
                assert not as_captured, f"{name}: {what} raised {error!r}, though its graph can run it as captured"
                continue  # refusing an argument the graph froze is the contract's other choice
            if as_captured:
                assert runner.stats.replays == replays + 1, f"{name}: {what} did not replay bucket {bucket}"
            kept.append((actual, map_tensors(actual, torch.Tensor.clone), what))
            for output, value, when in kept:  # a copy handed out never changes, not even within tolerance
                assert_equivalent(output, value, exact=True, context={
                    **context, "comparison": f"the output of {when} as handed out, read again after {what}"})
    finally:
        if name == "draft-step":
            model.draft_step = 0
        if name == "float-scale":
            model.scale = 1.0
