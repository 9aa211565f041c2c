"""Module discovery: which module's ``forward`` is the transformer layer stack to capture.

A rule is any callable ``rule(model) -> DiscoveryResult`` that may raise :class:`DiscoveryRefused` instead
(no stack, and no module to fall back to); :func:`discover_layer_model` tries rules in order. :data:`RULES`
names the shipped ones (:func:`harness_rule`, the default; :func:`sglang_pr24662_rule`, the rule of SGLang's
PR 24662, kept to compare). SGLang 0.5.23's shipped rule runs from the release's own code:
``harness.adapters.sglang.sglang_0_5_23_rule``. The README's Real architectures section describes them."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any, cast

from torch import nn

from harness.errors import DiscoveryError

__all__ = [
    "DiscoveryResult",
    "DiscoveryRule",
    "DiscoveryWarning",
    "DiscoveryRefused",
    "sglang_pr24662_rule",
    "harness_rule",
    "RULES",
    "DEFAULT_RULES",
    "discover_layer_model",
    "layer_list",
    "is_tower",
]


class DiscoveryWarning(UserWarning):
    """Discovery found no layer stack and fell back to a broader module."""


class DiscoveryRefused(DiscoveryError):
    """A rule found no layer stack and names no module to fall back to: it refuses the model, as SGLang 0.5.23's
    rule raises where its PR's fell back. ``rule`` names the rule, ``reason`` is its own words."""

    def __init__(self, rule: str, model_class: str, reason: str) -> None:
        super().__init__(f"discovery rule {rule!r} refuses {model_class}: {reason}")
        self.rule = rule
        self.model_class = model_class
        self.reason = reason

    def summary(self) -> dict[str, Any]:
        """Plain data for goldens and reports, in place of :meth:`DiscoveryResult.summary`."""
        return {"refused": self.reason, "rule": self.rule}


@dataclasses.dataclass(frozen=True)
class DiscoveryResult:
    """The module to capture, its dotted path from the model (``""`` for the model itself), whether
    the rule fell back, which rule decided, and the paths it looked at."""

    module: nn.Module
    path: str
    fell_back: bool
    rule: str
    tried: tuple[str, ...] = ()
    searched: bool = False  # found the stack, but by searching the module tree, not at a known path

    def summary(self) -> dict[str, Any]:
        """Plain data for goldens and reports (no module objects)."""
        return {
            "module_class": type(self.module).__name__,
            "path": self.path or "<root>",
            "fell_back": self.fell_back,
            "searched": self.searched,
            "rule": self.rule,
            "tried": list(self.tried),
        }


DiscoveryRule = Callable[[nn.Module], DiscoveryResult]


def _join(*parts: str) -> str:
    return ".".join(part for part in parts if part)


def sglang_pr24662_rule(model: nn.Module) -> DiscoveryResult:
    """The rule of SGLang's PR 24662 (the breakable CUDA-graph runner that captures the layer stack):
    ``getattr(model, "language_model", model)``, then its ``.model`` when that has ``.layers``; otherwise the
    language model itself (a fallback). SGLang 0.5.23 ships another rule, which refuses where this one falls
    back (``harness.adapters.sglang.sglang_0_5_23_rule``)."""
    language_model = getattr(model, "language_model", model)
    base = "language_model" if language_model is not model else ""
    tried = (_join(base, "model.layers"),) if base else ("language_model", "model.layers")
    inner = getattr(language_model, "model", None)
    if isinstance(inner, nn.Module) and hasattr(inner, "layers"):
        return DiscoveryResult(inner, _join(base, "model"), False, "sglang_pr24662", tried)
    return DiscoveryResult(language_model, base, True, "sglang_pr24662", tried)


# Where decoder layers live: ``layers`` (Llama and most), ``h`` (GPT-2, Bloom, Falcon, ...), ``blocks`` (MPT).
LAYER_LIST_NAMES = ("layers", "h", "blocks", "layer")
# Path components and class-name fragments of modality towers and their projectors, never the text stack.
_TOWER_WORDS = ("vision", "visual", "audio", "speech", "image", "video", "vit", "siglip", "clip", "pixtral",
                "multi_modal", "mm_projector", "connector", "resampler", "perceiver", "whisper")
# Modules that map hidden states to the vocabulary: a module holding one returns logits.
_HEAD_NAMES = ("lm_head", "embed_out", "logits_processor", "output_projection")
# Known places of the text stack below the model, in order: SGLang's two, the transformers 5.x VLM
# layout, a base model used as the language model, Idefics-style text models, OPT-style decoders.
_KNOWN_PATHS = ("language_model.model", "model", "model.language_model", "language_model", "model.text_model",
                "model.decoder", "")


def layer_list(module: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """The decoder-layer list ``module`` owns directly (attribute name and list), or ``None``."""
    for name in LAYER_LIST_NAMES:
        candidate = module._modules.get(name)
        if isinstance(candidate, nn.ModuleList) and len(candidate):
            return name, candidate
    return None


def is_tower(path: str, module: nn.Module) -> bool:
    """Whether ``module`` (at ``path``) is a vision/audio tower or a projector, judged by its path and class."""
    words = [part.lower() for part in path.split(".") if part] + [type(module).__name__.lower()]
    return any(word in part for part in words for word in _TOWER_WORDS)


def _holds_head(module: nn.Module) -> bool:
    return any(isinstance(module._modules.get(name), nn.Module) for name in _HEAD_NAMES)


def _is_stack(path: str, module: nn.Module | None) -> bool:
    return (isinstance(module, nn.Module) and layer_list(module) is not None and not _holds_head(module)
            and not is_tower(path, module))


def _submodule(model: nn.Module, path: str) -> nn.Module | None:
    module: Any = model
    for part in filter(None, path.split(".")):
        module = getattr(module, part, None) if isinstance(module, nn.Module) else None
    return module if isinstance(module, nn.Module) else None


def harness_rule(model: nn.Module) -> DiscoveryResult:
    """The harness's rule: the module that owns the decoder-layer list and holds no LM head (so its
    forward returns hidden states), outside any vision or audio tower.

    Known paths first (:data:`_KNOWN_PATHS`, then the transformers ``base_model_prefix`` with its
    ``decoder``/``language_model``/``text_model``); otherwise a breadth-first search of the module
    tree, shallowest stack first, the longest layer list on a tie (``searched=True``); otherwise
    the model itself (``fell_back=True``).
    """
    wrapped = getattr(model, "wrapped_model_path", None)  # an adapter names the model it wraps
    if isinstance(wrapped, str) and isinstance(wrapped_model := _submodule(model, wrapped), nn.Module):
        inner = harness_rule(wrapped_model)
        if not inner.fell_back:
            return dataclasses.replace(inner, path=_join(wrapped, inner.path),
                                       tried=tuple(_join(wrapped, path) for path in inner.tried))
    prefix = getattr(model, "base_model_prefix", "") or ""
    known = list(_KNOWN_PATHS)
    if prefix and isinstance(getattr(model, prefix, None), nn.Module):
        known[-1:-1] = [prefix, *(_join(prefix, inner) for inner in ("decoder", "language_model", "text_model"))]
    known = list(dict.fromkeys(known))
    for path in known:
        module = _submodule(model, path)
        if module is not None and _is_stack(path, module):
            return DiscoveryResult(module, path, False, "harness", tuple(known))
    found: list[tuple[int, int, str, nn.Module]] = []
    for path, module in model.named_modules(remove_duplicate=True):
        if _is_stack(path, module) and not any(is_tower(p, m) for p, m in _ancestors(model, path)):
            layers = cast("tuple[str, nn.ModuleList]", layer_list(module))  # a stack has a layer list
            found.append((path.count(".") if path else -1, -len(layers[1]), path, module))
    tried = (*known, "<search>")
    if found:
        _, _, path, module = min(found, key=lambda item: item[:3])
        return DiscoveryResult(module, path, False, "harness", tried, searched=True)
    return DiscoveryResult(model, "", True, "harness", tried)


def _ancestors(model: nn.Module, path: str) -> list[tuple[str, nn.Module]]:
    parts = path.split(".") if path else []
    # a path from model.named_modules(): each of its prefixes names a module
    return [(".".join(parts[:i]), cast(nn.Module, _submodule(model, ".".join(parts[:i]))))
            for i in range(1, len(parts))]


RULES: dict[str, DiscoveryRule] = {"harness": harness_rule, "sglang_pr24662": sglang_pr24662_rule}
DEFAULT_RULES: tuple[DiscoveryRule, ...] = (harness_rule,)


def _as_rules(rules: Sequence[DiscoveryRule | str] | DiscoveryRule | str) -> tuple[DiscoveryRule, ...]:
    listed: Sequence[DiscoveryRule | str] = (rules,) if isinstance(rules, str) or callable(rules) else rules
    resolved: list[DiscoveryRule] = []
    for rule in listed:
        if isinstance(rule, str):
            if rule not in RULES:
                raise DiscoveryError(f"unknown discovery rule {rule!r}; named rules: {', '.join(RULES)}")
            rule = RULES[rule]
        if not callable(rule):
            raise DiscoveryError(f"a discovery rule is a callable rule(model) -> DiscoveryResult, got {rule!r}")
        resolved.append(rule)
    return tuple(resolved)


def discover_layer_model(model: nn.Module, *,
                         rules: Sequence[DiscoveryRule | str] | DiscoveryRule | str = DEFAULT_RULES,
                         strict: bool = False) -> DiscoveryResult:
    """Find the layer stack of ``model`` with ``rules`` (callables, names from :data:`RULES`, or one of either).

    A rule that found the stack at a known path wins. Otherwise a rule that found it by searching
    is taken with a :class:`DiscoveryWarning` naming the path (``strict=True`` raises
    :class:`DiscoveryError` instead: a searched path is a guess a user should confirm). When every
    rule falls back, the first rule's fallback is returned with a warning naming the model class and
    the paths tried (strict: raises), because capturing a broader module puts batch-size dependent
    code in the graph. A rule that refuses (:class:`DiscoveryRefused`) gives no result; when every rule
    refuses, the first refusal is raised.
    """
    rules = _as_rules(rules)
    if not rules:
        raise DiscoveryError("discover_layer_model needs at least one rule")
    results: list[DiscoveryResult] = []
    refusals: list[DiscoveryRefused] = []
    for rule in rules:
        try:
            results.append(rule(model))
        except DiscoveryRefused as refusal:
            refusals.append(refusal)
    if not results:
        raise refusals[0]
    for result in results:
        if not result.fell_back and not result.searched:
            return result
    for result in results:
        if not result.fell_back:
            where = f"model.{result.path} ({type(result.module).__name__}, rule {result.rule!r})"
            if strict:
                raise DiscoveryError(
                    f"the layer stack of {type(model).__name__} is at no known path; strict discovery refuses the "
                    f"search result {where}. Pass rules=[...] with a rule that knows this layout.")
            message = (
                f"the layer stack of {type(model).__name__} is at no known path; a search of the module tree chose "
                f"{where}: the module owning the decoder-layer list with no LM head. Pass rules=[...] with your "
                "own rule to make this explicit."
            )
            warnings.warn(message, DiscoveryWarning, stacklevel=2)
            return result
    tried = tuple(path for result in results for path in result.tried)
    chosen = results[0]
    where = f"model.{chosen.path}" if chosen.path else "the model itself"
    message = (
        f"no transformer layer stack found in {type(model).__name__}: none of the paths {list(tried)} holds "
        f"a decoder-layer list ({'/'.join(LAYER_LIST_NAMES)}) without an LM head; falling back to {where} "
        f"({type(chosen.module).__name__}). Its forward "
        "holds batch-size dependent code, so only single-request batches can replay its graph."
    )
    if strict:
        raise DiscoveryError(message.replace("; falling back to", "; strict discovery refuses to fall back to"))
    warnings.warn(message, DiscoveryWarning, stacklevel=2)
    return dataclasses.replace(chosen, tried=tried)
