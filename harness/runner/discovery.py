"""Module discovery: which module's ``forward`` is the transformer layer stack to capture.

A *rule* is a callable ``rule(model) -> DiscoveryResult``; its result says which module, by which
dotted path from the model, and whether the rule fell back (found no layer stack and chose a
broader module). :func:`discover_layer_model` tries its rules in order, takes the first that did
not fall back, and otherwise falls back to the first rule's choice with a
:class:`DiscoveryWarning` (or a :class:`~harness.errors.DiscoveryError` in strict mode).
:func:`sglang_rule` is the reference rule; add rules for other layouts without touching it.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Sequence

from torch import nn

from harness.errors import DiscoveryError

__all__ = [
    "DiscoveryResult",
    "DiscoveryRule",
    "DiscoveryWarning",
    "sglang_rule",
    "DEFAULT_RULES",
    "discover_layer_model",
]


class DiscoveryWarning(UserWarning):
    """Discovery found no layer stack and fell back to a broader module."""


@dataclasses.dataclass(frozen=True)
class DiscoveryResult:
    """The module to capture, its dotted path from the model (``""`` for the model itself), whether
    the rule fell back, which rule decided, and the paths it looked at."""

    module: nn.Module
    path: str
    fell_back: bool
    rule: str
    tried: tuple[str, ...] = ()

    def summary(self) -> dict[str, Any]:
        """Plain data for goldens and reports (no module objects)."""
        return {
            "module_class": type(self.module).__name__,
            "path": self.path or "<root>",
            "fell_back": self.fell_back,
            "rule": self.rule,
            "tried": list(self.tried),
        }


DiscoveryRule = Callable[[nn.Module], DiscoveryResult]


def _join(*parts: str) -> str:
    return ".".join(part for part in parts if part)


def sglang_rule(model: nn.Module) -> DiscoveryResult:
    """SGLang's rule: ``getattr(model, "language_model", model)``, then its ``.model`` when that has
    ``.layers``; otherwise the language model itself (a fallback)."""
    language_model = getattr(model, "language_model", model)
    base = "language_model" if language_model is not model else ""
    tried = (_join(base, "model.layers"),) if base else ("language_model", "model.layers")
    inner = getattr(language_model, "model", None)
    if isinstance(inner, nn.Module) and hasattr(inner, "layers"):
        return DiscoveryResult(inner, _join(base, "model"), False, "sglang", tried)
    return DiscoveryResult(language_model, base, True, "sglang", tried)


DEFAULT_RULES: tuple[DiscoveryRule, ...] = (sglang_rule,)


def discover_layer_model(model: nn.Module, *, rules: Sequence[DiscoveryRule] = DEFAULT_RULES,
                         strict: bool = False) -> DiscoveryResult:
    """Find the layer stack of ``model``.

    When every rule falls back: ``strict=True`` raises :class:`DiscoveryError`; otherwise the first
    rule's fallback is returned and a :class:`DiscoveryWarning` names the model class and the paths
    tried, because capturing a broader module puts batch-size dependent code in the graph.
    """
    if not rules:
        raise DiscoveryError("discover_layer_model needs at least one rule")
    results = [rule(model) for rule in rules]
    for result in results:
        if not result.fell_back:
            return result
    tried = tuple(path for result in results for path in result.tried)
    chosen = results[0]
    where = f"model.{chosen.path}" if chosen.path else "the model itself"
    message = (
        f"no transformer layer stack found in {type(model).__name__}: none of the paths {list(tried)} exists "
        f"with a '.layers' attribute; falling back to {where} ({type(chosen.module).__name__}). Its forward "
        "holds batch-size dependent code, so only single-request batches can replay its graph."
    )
    if strict:
        raise DiscoveryError(message.replace("; falling back to", "; strict discovery refuses to fall back to"))
    warnings.warn(message, DiscoveryWarning, stacklevel=2)
    return dataclasses.replace(chosen, tried=tried)
