"""The discovery and capture matrices of the transformers zoo: what each rule chooses, and whether
the chosen stack captures and replays like eager. Plain data, stored as goldens by the suites.

``discovery_matrix()`` -> ``{architecture: {"family", "rules": {rule: row}}}``, a row being the
path chosen, whether the rule fell back or searched, whether the module owns the layer list and
what its forward returns (measured by running the model: ``hidden_states`` or ``logits``).
``capture_row(name, graphs=...)`` -> whether the harness rule's stack captures (or the
``CaptureError`` naming the op) and whether replay matches eager on a batch of several requests.
"""

from __future__ import annotations

import warnings
from typing import Any, Iterable

import torch
from torch import nn

from harness.compare import tolerance_for
from harness.errors import CaptureError, HarnessError
from harness.models.transformers_adapter import TransformersAdapter
from harness.models.transformers_zoo import (
    ARCHITECTURES,
    VOCAB_SIZE,
    ArchitectureUnavailable,
    architecture,
    build_architecture,
    text_config_of,
)
from harness.batch import ForwardBatch
from harness.runner.discovery import RULES, DiscoveryResult, layer_list
from harness.runner.runner import LayerStackRunner

__all__ = ["forward_returns", "discovery_row", "discovery_matrix", "capture_row", "MATRIX_LENGTHS"]

MATRIX_LENGTHS = (3, 5, 2)  # the capture matrix's batch: three requests, so packing matters


def forward_returns(model: nn.Module, modules: list[nn.Module]) -> list[str]:
    """Run ``model`` once on a short input and classify what each of ``modules`` returned: ``logits``
    (last dimension the vocabulary), ``hidden_states`` (the hidden size), ``other`` or ``not-called``."""
    seen: dict[int, Any] = {}
    handles = [module.register_forward_hook(lambda m, _a, output: seen.setdefault(id(m), output))
               for module in modules]
    try:
        with torch.no_grad():
            model(input_ids=torch.arange(3, 9, device=_device(model))[None] % (VOCAB_SIZE - 2), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return [_classify(model, seen[id(module)]) if id(module) in seen else "not-called" for module in modules]


def _classify(model: nn.Module, output: Any) -> str:
    if hasattr(output, "logits"):
        return "logits"
    tensor = output if isinstance(output, torch.Tensor) else getattr(output, "last_hidden_state", None)
    if tensor is None and isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        tensor = output[0]
    if tensor is None:
        return "other"
    text = text_config_of(model)
    if tensor.shape[-1] == text.vocab_size:
        return "logits"
    return "hidden_states" if tensor.shape[-1] == text.hidden_size else "other"


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def discovery_row(result: DiscoveryResult, returns: str) -> dict[str, Any]:
    """One cell of the discovery matrix (plain data)."""
    return {
        "path": result.path or "<root>",
        "module_class": type(result.module).__name__,
        "fell_back": result.fell_back,
        "searched": result.searched,
        "owns_layer_list": layer_list(result.module) is not None,
        "returns": returns,
    }


def discovery_matrix(names: Iterable[str] | None = None, *, rules: dict[str, Any] = RULES,
                     seed: int = 0) -> dict[str, Any]:
    """Every architecture (or ``names``) against every rule; unavailable ones with their reason."""
    matrix: dict[str, Any] = {}
    for name in names if names is not None else [arch.name for arch in ARCHITECTURES]:
        family = architecture(name).family
        try:
            model = build_architecture(name, seed=seed)
        except ArchitectureUnavailable as error:
            matrix[name] = {"family": family, "unavailable": str(error).split(": ", 1)[-1].split(":")[0]}
            continue
        results = {rule_name: rule(model) for rule_name, rule in rules.items()}
        returns = forward_returns(model, [result.module for result in results.values()])
        matrix[name] = {"family": family, "rules": {rule_name: discovery_row(result, kind) for (rule_name, result), kind
                                                    in zip(results.items(), returns)}}
    return matrix


def capture_row(name: str, *, graphs: Any, device: torch.device | str = "cpu", buckets: tuple[int, ...] = (16,),
                seed: int = 0) -> dict[str, Any]:
    """Capture the harness rule's stack of ``name`` through the adapter and replay a batch of
    :data:`MATRIX_LENGTHS`; ``max_abs_diff`` is for reports, not goldens (it differs by backend)."""
    model = build_architecture(name, seed=seed, device=device)
    adapter = TransformersAdapter(model, layout=architecture(name).layout)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            runner = LayerStackRunner(adapter, buckets=buckets, graphs=graphs)
        except CaptureError as error:
            message = str(error)
            return {"captures": False, "stopped_by": message.split(" cannot be captured")[0],
                    "replay_matches_eager": None, "max_abs_diff": None}
    batch = ForwardBatch.from_lengths(list(MATRIX_LENGTHS), vocab_size=VOCAB_SIZE - 2, seed=seed, device=device)
    try:
        actual = runner.run(batch).next_token_logits
    except HarnessError as error:
        return {"captures": True, "stopped_by": f"replay: {error}", "replay_matches_eager": False, "max_abs_diff": None}
    with torch.no_grad():
        expected = adapter(batch.input_ids, batch.positions, batch).next_token_logits
    tol = tolerance_for(expected.dtype)
    difference = float((actual.double() - expected.double()).abs().max())
    matches = bool(torch.allclose(actual, expected, rtol=tol.rtol, atol=tol.atol))
    return {"captures": True, "stopped_by": None, "replay_matches_eager": matches, "max_abs_diff": difference}
