"""Discovery: each layout gives the expected module, path and fallback flag; a fallback warns (or,
strict, raises); a fell-back model stays correct: single requests replay, several run eagerly. And
SGLang 0.5.23's shipped rule on the transformers zoo, run from the release's own code where a folder
of it is here (a golden beside the discovery matrix of suites/runner/architectures)."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.errors import DiscoveryError, HarnessError
from harness.golden import assert_upstream_golden
from harness.models import build_model
from harness.oracle import CALLING_MODES
from harness.runner.cases import MAX_TOKENS, SEED, make_batch, split_strategy
from harness.runner.discovery import DiscoveryRefused, discover_layer_model, sglang_pr24662_rule

pytestmark = pytest.mark.clause("discovery")

# The oracle, written out by hand from each layout's construction under the harness's rule:
# (dotted path, fell back, found by searching the module tree).
LAYOUTS = {
    "dense": ("model", False, False),
    "moe": ("model", False, False),
    "vlm": ("language_model.model", False, False),
    "side-input": ("model", False, False),
    "odd-decoder-layers": ("model.decoder", False, False),
    "odd-transformer-h": ("transformer", False, True),
    "odd-lm-is-base": ("language_model", False, False),
    "odd-wrapped-stack": ("module.model", False, True),
    "odd-unnamed-layers": ("", True, False),
}
# Layouts the harness's rule only finds by searching: a warning, and strict discovery refuses them.
SEARCHED = [name for name, (_, _, searched) in LAYOUTS.items() if searched]
# Layouts where it falls back to the whole model: a layer list under a name no rule knows.
FALLBACKS = [name for name, (_, fell_back, _) in LAYOUTS.items() if fell_back]


def _build_recording_warnings(build_runner, model, **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner = build_runner(model, **options)
    return runner, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_discovered_module_and_path(build_runner, device, name):
    path, fell_back, _ = LAYOUTS[name]
    model = build_model(name, seed=SEED, device=device)
    runner, _ = _build_recording_warnings(build_runner, model)
    expected_module = model.get_submodule(path)
    found = runner.discovery
    assert (found.path, found.fell_back) == (path, fell_back), (
        f"{name}: discovery gave path {found.path!r}, fell_back={found.fell_back}; expected {path!r}, {fell_back}")
    assert found.module is expected_module, (
        f"{name}: discovered a {type(found.module).__name__}, not the module at {path!r}")


# Its name is from before the module and path moved to the test above: the kill matrix
# (golden/selfcheck/kill_matrix.json) names it as the killing test of mutant:silent-fallback.
@pytest.mark.clause("discovery-reported")
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_discovered_module_path_and_warning(build_runner, device, name):
    """A layout found only by searching, or one where discovery falls back, warns naming the model's class; a
    layout found at a known path does not warn."""
    _, fell_back, searched = LAYOUTS[name]
    model = build_model(name, seed=SEED, device=device)
    _, messages = _build_recording_warnings(build_runner, model)
    fallback_warnings = [m for m in messages if type(model).__name__ in m]
    if fell_back or searched:
        assert fallback_warnings, (
            f"{name}: fell back without a warning naming {type(model).__name__} and the paths tried; got {messages}")
    else:
        assert not fallback_warnings, f"{name}: warned although discovery found the stack: {fallback_warnings}"


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_discover_layer_model_warns_with_its_own_category(device, name):
    """``discover_layer_model`` (the harness's function, not the runner under test) warns with
    :class:`DiscoveryWarning`, the category a caller filters on (README), exactly where the layout was found by
    searching or fell back, and nowhere else."""
    _, fell_back, searched = LAYOUTS[name]
    model = build_model(name, seed=SEED, device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        discover_layer_model(model)
    categories = [w.category.__name__ for w in caught if type(model).__name__ in str(w.message)]
    expected = ["DiscoveryWarning"] if fell_back or searched else []
    assert categories == expected, (
        f"{name}: discover_layer_model warned {categories} naming {type(model).__name__}, expected {expected}")


@pytest.mark.clause("discovery-reported")
@pytest.mark.parametrize("name", SEARCHED + FALLBACKS)
def test_strict_discovery_refuses_to_fall_back(build_runner, device, name):
    model = build_model(name, seed=SEED, device=device)
    with pytest.raises(DiscoveryError, match=type(model).__name__):
        build_runner(model, strict_discovery=True)


@pytest.mark.clause("discovery-reported")
def test_strict_discovery_accepts_a_found_stack(build_runner, device):
    model = build_model("vlm", seed=SEED, device=device)
    assert build_runner(model, strict_discovery=True).discovery.path == "language_model.model"


@pytest.mark.long_running
def test_discovery_goldens(build_runner, device, snapshot):
    results = {}
    for name in LAYOUTS:
        model = build_model(name, seed=SEED, device=device)
        runner, _ = _build_recording_warnings(build_runner, model)
        found = runner.discovery
        results[name] = {"module_class": type(found.module).__name__, "path": found.path, "fell_back": found.fell_back}
    assert results == snapshot


@pytest.mark.clause("fell-back-graph")
@pytest.mark.parametrize("name", FALLBACKS)
@given(length=st.integers(1, MAX_TOKENS), seed=st.integers(0, 2**16), calling=st.sampled_from(CALLING_MODES))
def test_fell_back_model_replays_single_requests(zoo_runner, check_run, device, name, length, seed, calling):
    model, runner = zoo_runner(name)
    batch = make_batch(name, [length], seed=seed, dtype=torch.float32, device=device)
    assert runner.can_run(batch), f"{name}: a single request of {length} tokens should replay"
    replays = runner.stats.replays
    check_run(runner, model, batch, mode=calling, model=name, seed=seed)
    assert runner.stats.replays == replays + 1


@pytest.mark.clause("fell-back-graph")
@pytest.mark.parametrize("name", FALLBACKS)
@given(data=st.data(), total=st.integers(2, MAX_TOKENS), seed=st.integers(0, 2**16),
       mode=st.sampled_from(["none", "full"]), calling=st.sampled_from(CALLING_MODES))
def test_fell_back_model_runs_several_requests_eagerly(zoo_runner, check_run, device, name, data, total, seed, mode,
                                                       calling):
    model, runner = zoo_runner(name)
    lengths = data.draw(split_strategy(total).filter(lambda split: len(split) > 1), label="lengths")
    batch = make_batch(name, lengths, seed=seed, dtype=torch.float32, device=device, hidden_mode=mode)
    assert not runner.can_run(batch), (
        f"{name}: the fell-back graph holds batch-size dependent code; {batch.describe()} must not replay")
    with pytest.raises(HarnessError):
        runner.replay(batch)
    fallbacks = runner.stats.eager_fallbacks
    check_run(runner, model, batch, mode=calling, replayed=False, model=name, seed=seed)
    assert runner.stats.eager_fallbacks == fallbacks + 1, "the eager fallback was not counted"


@pytest.mark.clause("fell-back-graph")
@pytest.mark.parametrize("name", FALLBACKS)
@pytest.mark.parametrize(("mode", "all_logits"), [("last", False), ("full", False), ("none", True)])
def test_fell_back_model_runs_other_outputs_of_one_request_eagerly(zoo_runner, check_run, device, name, mode,
                                                                   all_logits):
    """A fell-back graph froze the capture batch's outputs (hidden mode none, last-token logits): a single
    request asking for other outputs must run eagerly too, not only batches of several requests."""
    model, runner = zoo_runner(name)
    batch = make_batch(name, [5], seed=3, dtype=torch.float32, device=device, hidden_mode=mode, all_logits=all_logits)
    assert not runner.can_run(batch), (
        f"{name}: the fell-back graph froze hidden mode none and last-token logits; {batch.describe()} must not replay")
    fallbacks = runner.stats.eager_fallbacks
    check_run(runner, model, batch, replayed=False, model=name, seed=3)
    assert runner.stats.eager_fallbacks == fallbacks + 1, "the eager fallback was not counted"


# --- SGLang 0.5.23's shipped rule on the transformers zoo -------------------------------------------------
# harness.adapters.sglang.sglang_0_5_23_rule runs SGLang's own _resolve_transformer_layer_model, cut verbatim
# from the release wheel by .ci/gpu/extract-sglang into the folder's sglang_discovery.py: the folder named by
# HARNESS_SGLANG_MODULES, else .sglang in the rootdir. Recorded beside the other rules, not enforced.

ZOO_SEED = 7  # the architecture suites' seed (suites/runner/architectures/conftest.py)


@pytest.fixture(scope="module")
def sglang_0_5_23_matrix(pytestconfig):
    """The zoo's discovery matrix under every rule of RULES and SGLang 0.5.23's, the folder on sys.path only
    while it is computed."""
    given = os.environ.get("HARNESS_SGLANG_MODULES")
    folder = Path(given) if given else pytestconfig.rootpath / ".sglang"
    if not (folder / "sglang_discovery.py").is_file():
        pytest.skip(f"SGLang 0.5.23's discovery rule runs the release's own code, and {folder} holds no "
                    f"sglang_discovery.py: .ci/gpu/extract-sglang WHEEL {folder} writes it from the sglang 0.5.23 "
                    "wheel (pip download sglang==0.5.23 --no-deps), or set HARNESS_SGLANG_MODULES to such a folder")
    from harness.adapters.sglang import sglang_0_5_23_rule
    from harness.runner import RULES
    from harness.runner.matrices import discovery_matrix

    sys.path.insert(0, str(folder))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return discovery_matrix(rules={**RULES, "sglang_0_5_23": sglang_0_5_23_rule}, seed=ZOO_SEED)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("sglang_discovery", None)


def _verdicts(matrix, rule):
    """``{"resolves": [...], "falls_back": [...], "refuses": [...]}``: the architectures of each kind under ``rule``."""
    kinds = {"resolves": [], "falls_back": [], "refuses": []}
    for name, row in matrix.items():
        if "rules" in row:
            cell = row["rules"][rule]
            kinds["refuses" if "refused" in cell else "falls_back" if cell["fell_back"] else "resolves"].append(name)
    return {kind: {"count": len(names), "architectures": names} for kind, names in kinds.items()}


@pytest.mark.long_running
def test_sglang_0_5_23_discovery_golden(sglang_0_5_23_matrix, snapshot):
    # Each rule's verdict on every architecture that builds, and SGLang 0.5.23's cell of each (the module it
    # resolves, or its RuntimeError's message where it refuses); the other rules' cells are the discovery
    # matrix golden's. Written where the folder exists (--snapshot-update), a reviewable diff on a new release.
    # The zoo is transformers' code: one golden per transformers release (harness.golden.assert_upstream_golden).
    rules = next(row["rules"] for row in sglang_0_5_23_matrix.values() if "rules" in row)
    assert_upstream_golden(snapshot, {
        "verdicts": {rule: _verdicts(sglang_0_5_23_matrix, rule) for rule in rules},
        "unavailable": sorted(name for name, row in sglang_0_5_23_matrix.items() if "rules" not in row),
        "sglang_0_5_23": {name: row["rules"]["sglang_0_5_23"] for name, row in sglang_0_5_23_matrix.items()
                          if "rules" in row},
    }, package="transformers")


# The rule of SGLang's PR 24662 (harness.runner.discovery.sglang_pr24662_rule), written out by hand from its definition
# for each layout: getattr(model, "language_model", model), then its ``.model`` when that has ``.layers``; otherwise
# the language model itself, fallen back. (dotted path, fell back); it never searches.
SGLANG_PR24662 = {
    "dense": ("model", False),
    "moe": ("model", False),
    "vlm": ("language_model.model", False),
    "side-input": ("model", False),
    "odd-decoder-layers": ("", True),
    "odd-transformer-h": ("", True),
    "odd-lm-is-base": ("language_model", True),
    "odd-wrapped-stack": ("", True),
    "odd-unnamed-layers": ("", True),
}


@pytest.mark.parametrize("name", list(SGLANG_PR24662))
def test_sglang_pr24662_rule_on_every_layout(device, name):
    """The harness's own rule (not the runner under test): module, path, fallback and the paths it says it tried."""
    path, fell_back = SGLANG_PR24662[name]
    model = build_model(name, seed=SEED, device=device)
    found = sglang_pr24662_rule(model)
    base = "language_model" if hasattr(model, "language_model") else ""
    tried = (f"{base}.model.layers",) if base else ("language_model", "model.layers")
    assert (found.path, found.fell_back, found.searched, found.rule, found.tried) == (
        path, fell_back, False, "sglang_pr24662", tried), f"{name}: {found.summary()}"
    assert found.module is model.get_submodule(path), f"{name}: not the module at {path!r}"


def _refusing_rule(name):
    """A rule named ``name`` that refuses every model, in words of its own (so that each refusal can be told apart)."""

    def refuse(refused):
        raise DiscoveryRefused(name, type(refused).__name__, f"no layer stack of {name}'s")

    return refuse


@pytest.mark.parametrize("refusing", [1, 2, 3])
def test_a_refusing_rule_gives_way_to_the_next_or_is_raised(device, refusing):
    """A rule that refuses (:class:`DiscoveryRefused`) gives no result: the next rule decides, and where every rule
    refuses the first refusal is raised, naming the rule, the model's class and the rule's reason. Each rule refuses
    in its own words, so a later refusal raised in its place is seen, for one refusing rule and for several."""
    model = build_model("dense", seed=SEED, device=device)
    names = [f"refuses-{index}" for index in range(refusing)]
    rules = [_refusing_rule(name) for name in names]
    with pytest.raises(DiscoveryRefused) as raised:
        discover_layer_model(model, rules=rules)
    refusal = raised.value
    assert (refusal.rule, refusal.model_class, refusal.reason) == (
        names[0], type(model).__name__, f"no layer stack of {names[0]}'s"), (
        f"{refusing} rules refused; raised {refusal.rule!r}'s refusal ({refusal}), not the first rule's")
    assert str(refusal) == f"discovery rule {names[0]!r} refuses {type(model).__name__}: no layer stack of {names[0]}'s"
    assert refusal.summary() == {"refused": f"no layer stack of {names[0]}'s", "rule": names[0]}
    found = discover_layer_model(model, rules=[*rules, "harness"])
    assert (found.path, found.rule, found.module) == ("model", "harness", model.get_submodule("model"))


@pytest.mark.parametrize("inner", ["", "decoder", "language_model", "text_model"])
def test_a_base_model_prefix_and_its_inner_places_are_known_paths(device, inner):
    """A model's ``base_model_prefix`` (transformers) names where its base model is: the stack there, or at its
    ``decoder``, ``language_model`` or ``text_model``, is found at a known path, for a prefix no rule lists itself,
    so strict discovery takes it (``discover_layer_model``, the harness's function, not the runner under test)."""
    stack = build_model("dense", seed=SEED, device=device).get_submodule("model")
    base = stack if not inner else torch.nn.Module()
    if inner:
        base.add_module(inner, stack)
    model = torch.nn.Module()
    model.base_model_prefix = "trunk"  # no rule knows the name: only the prefix says where the base model is
    model.trunk = base
    path = ".".join(part for part in ("trunk", inner) if part)
    found = discover_layer_model(model, strict=True)
    assert (found.path, found.fell_back, found.searched, found.module) == (path, False, False, stack), (
        f"base_model_prefix 'trunk', stack at {path!r}: discovery gave {found.summary()}")


# --- a modality tower named by its class only ---------------------------------------------------------------
# Transformers names a tower by its class (SiglipVisionModel, WhisperEncoder) while the attribute holding it may be
# plain ("encoder"); a layer stack anywhere below such a tower is the tower's, never the text stack, whatever the
# names between them. The oracle is the construction: the text stack is the one the model's forward calls.
TOWER_CLASSES = ("SiglipVisionModel", "WhisperEncoder", "Qwen2VisionTransformerPretrainedModel")


class _TowerAndText(torch.nn.Module):
    """A wrapped text model at ``text`` (its stack at ``text.module.model``, found only by searching) beside a
    tower at ``encoder`` holding another layer stack at ``encoder`` + ``between`` + ``trunk``; forward runs the
    text model only."""

    def __init__(self, text: torch.nn.Module, tower: torch.nn.Module, trunk: torch.nn.Module,
                 between: tuple[str, ...]) -> None:
        super().__init__()
        self.config = text.config
        self.text = text
        self.encoder = tower
        holder = tower
        for name in between:
            holder.add_module(name, torch.nn.Module())
            holder = getattr(holder, name)
        holder.trunk = trunk

    def forward(self, input_ids, positions, batch):
        return self.text(input_ids, positions, batch)


@pytest.mark.parametrize("tower_class", TOWER_CLASSES)
@pytest.mark.parametrize("between", [(), ("blocks",)], ids=["trunk-below-tower", "trunk-two-below-tower"])
def test_stack_inside_a_tower_named_by_its_class_is_never_the_text_stack(build_runner, check_run, device,
                                                                          tower_class, between):
    """The tower's stack is as shallow as the text stack or shallower, and comes first by path: only its being
    inside a tower (judged by every ancestor, not by its own path) keeps discovery off it. The runner must find the
    text stack and replay as eager runs."""
    text = build_model("odd-wrapped-stack", seed=SEED, device=device)
    trunk = build_model("dense", seed=SEED + 1, device=device).get_submodule("model")
    tower = type(tower_class, (torch.nn.Module,), {})()
    model = _TowerAndText(text, tower, trunk, between).to(device).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # found by searching: the warning is test_discovered_module_path_and_warning's
        runner = build_runner(model)
    assert runner.discovery.module is text.get_submodule("module.model"), (
        f"a {tower_class} at 'encoder' holds a layer stack at {'.'.join(('encoder', *between, 'trunk'))!r}; "
        f"discovery gave {runner.discovery.path!r} ({type(runner.discovery.module).__name__}), not the text stack "
        "at 'text.module.model'")
    batch = make_batch("odd-wrapped-stack", [3, 2], seed=SEED, dtype=torch.float32, device=device)
    check_run(runner, model, batch, model=f"text beside a {tower_class}", between=".".join(between))
