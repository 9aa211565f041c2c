"""The discovery and capture matrices of the transformers zoo, plain data stored as goldens.

:func:`discovery_matrix` (what each rule chooses) and :func:`capture_row` (whether the chosen stack
captures and replays like eager)."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from harness.batch import ForwardBatch
from harness.compare import ComputeSettings, tolerance_for
from harness.errors import CaptureError
from harness.models.transformers_adapter import TransformersAdapter
from harness.models.transformers_zoo import (
    ARCHITECTURES,
    VOCAB_SIZE,
    ArchitectureUnavailable,
    architecture,
    build_architecture,
    text_config_of,
)
from harness.runner.discovery import RULES, DiscoveryRefused, DiscoveryResult, DiscoveryRule, layer_list
from harness.runner.runner import LayerStackRunner

__all__ = ["forward_returns", "discovery_row", "discovery_matrix", "capture_row", "rule_below_adapter",
           "MATRIX_LENGTHS"]

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
    """Every architecture (or ``names``) against every rule; unavailable ones with their reason. A rule that
    refuses an architecture (:class:`DiscoveryRefused`) has the cell ``{"refused": reason}``."""
    matrix: dict[str, Any] = {}
    for name in names if names is not None else [arch.name for arch in ARCHITECTURES]:
        family = architecture(name).family
        try:
            model = build_architecture(name, seed=seed)
        except ArchitectureUnavailable as error:
            matrix[name] = {"family": family, "unavailable": error.reason}
            continue
        results: dict[str, DiscoveryResult] = {}
        refused: dict[str, dict[str, Any]] = {}
        for rule_name, rule in rules.items():
            try:
                results[rule_name] = rule(model)
            except DiscoveryRefused as refusal:
                refused[rule_name] = {"refused": refusal.reason}
        returns = dict(zip(results, forward_returns(model, [result.module for result in results.values()]))
                       if results else ())
        matrix[name] = {"family": family, "rules": {
            rule_name: refused[rule_name] if rule_name in refused else discovery_row(results[rule_name],
                                                                                     returns[rule_name])
            for rule_name in rules}}
    return matrix


def rule_below_adapter(rule: DiscoveryRule) -> DiscoveryRule:
    """``rule`` applied to the transformers model an adapter wraps (at its ``wrapped_model_path``),
    with the path made relative to the adapter: how a rule written for transformers models (SGLang's)
    chooses the stack a runner over the adapter captures."""

    def below(adapter: nn.Module) -> DiscoveryResult:
        prefix = adapter.wrapped_model_path
        inner = rule(adapter.get_submodule(prefix))
        return dataclasses.replace(inner, path=".".join(filter(None, (prefix, inner.path))))

    below.__name__ = f"{getattr(rule, '__name__', 'rule')}_below_adapter"
    return below


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]


def _capture_cell(adapter: TransformersAdapter, rule: DiscoveryRule, *, graphs: Any, buckets: tuple[int, ...],
                  seed: int, device: torch.device | str) -> dict[str, Any]:
    cell: dict[str, Any] = {"captures": False, "stop_kind": None, "stopped_by": None, "replays_several_requests": None,
                            "replay_matches_eager": None, "max_abs_diff": None}
    try:
        runner = LayerStackRunner(adapter, buckets=buckets, graphs=graphs, rules=(rule,))
    except CaptureError as error:  # the emulated backend names the op and where it was made (CUDA does not)
        message = str(error)
        site = message.partition(" Made at ")[2].split(" (")[0]
        return {**cell, "stop_kind": "CaptureError",
                "stopped_by": (message.split(" cannot be captured")[0].splitlines()[0]
                               + (f" at {site}" if site else ""))[:200]}
    except Exception as error:  # real HF code under capture: record what stopped it, keep the matrix going
        return {**cell, "stop_kind": type(error).__name__, "stopped_by": _first_line(error)}
    batch = ForwardBatch.from_lengths(list(MATRIX_LENGTHS), vocab_size=VOCAB_SIZE - 2, seed=seed, device=device)
    several = bool(runner.can_run(batch))
    if not several:  # a fallback replays single requests only: check one of the same token count
        batch = ForwardBatch.from_lengths([sum(MATRIX_LENGTHS)], vocab_size=VOCAB_SIZE - 2, seed=seed, device=device)
    cell.update(captures=True, replays_several_requests=several)
    try:
        actual = runner.replay(batch).next_token_logits
    except Exception as error:
        return {**cell, "stop_kind": f"replay: {type(error).__name__}", "stopped_by": f"replay: {_first_line(error)}",
                "replay_matches_eager": False}
    with torch.no_grad():
        expected = adapter(batch.input_ids, batch.positions, batch).next_token_logits
    tol = tolerance_for(expected.dtype, device_type=expected.device.type, settings=ComputeSettings.now())
    cell["max_abs_diff"] = float((actual.double() - expected.double()).abs().max())
    cell["replay_matches_eager"] = bool(torch.allclose(actual, expected, rtol=tol.rtol, atol=tol.atol))
    return cell


def capture_row(name: str, *, graphs: Any, device: torch.device | str = "cpu", rules: dict[str, Any] = RULES,
                buckets: tuple[int, ...] = (16,), seed: int = 0) -> dict[str, Any]:
    """``{rule: cell}`` for architecture ``name``: each rule's stack (chosen below the adapter, see
    :func:`rule_below_adapter`) captured for ``buckets`` and replayed on :data:`MATRIX_LENGTHS` (a
    single request of as many tokens where the rule fell back). A cell: the path and fallback flag,
    ``captures`` (or ``stop_kind``, the exception class, and ``stopped_by``, its first line: the
    :class:`CaptureError` naming the op on the emulated backend), ``replays_several_requests``,
    ``replay_matches_eager`` (tolerance table) and ``max_abs_diff``. ``stopped_by`` and
    ``max_abs_diff`` are for reports, not goldens: they differ by backend. Rules choosing the same
    module share a cell; a rule that refuses the architecture has ``{"refused": reason}``.
    """
    model = build_architecture(name, seed=seed, device=device)
    adapter = TransformersAdapter(model, layout=architecture(name).layout)
    cells: dict[str, Any] = {}
    by_module: dict[int, dict[str, Any]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rule_name, rule in rules.items():
            below = rule_below_adapter(rule)
            try:
                result = below(adapter)
            except DiscoveryRefused as refusal:
                cells[rule_name] = {"refused": refusal.reason}
                continue
            if id(result.module) not in by_module:
                by_module[id(result.module)] = _capture_cell(adapter, below, graphs=graphs, buckets=buckets,
                                                             seed=seed, device=device)
            path = result.path.removeprefix(adapter.wrapped_model_path).lstrip(".")
            cells[rule_name] = {"path": path or "<root>", "fell_back": result.fell_back,
                                **by_module[id(result.module)]}
    return cells
