"""What a gather implementation must look like, checked when it is loaded (``--impl gather=...``).

A candidate is a callable ``gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf,
hidden_states_buf)`` returning ``(topk_p, topk_index, bonus_tokens, hidden_states)``. It may declare
``promised_kernel_launches``: an ``int`` (launches per call, with or without hidden states) or a
mapping ``{"with_hidden": int, "without_hidden": int}``; the launch suite then asserts it on CUDA.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Optional

from harness.errors import ImplementationError

__all__ = ["PROMISE_ATTRIBUTE", "validate_gather", "promised_launches"]

PROMISE_ATTRIBUTE = "promised_kernel_launches"
_SIGNATURE = "gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf)"
_PROMISE_KEYS = ("with_hidden", "without_hidden")


def _describe(candidate: Any) -> str:
    return getattr(candidate, "__qualname__", None) or type(candidate).__name__


def _parse_promise(promise: Any, spec: str) -> Optional[dict[str, int]]:
    if promise is None:
        return None
    if isinstance(promise, bool) or not isinstance(promise, (int, Mapping)):
        raise ImplementationError(
            f"--impl {spec}: {PROMISE_ATTRIBUTE} must be an int or a mapping with keys {_PROMISE_KEYS}, "
            f"got {type(promise).__name__} {promise!r}")
    values = dict.fromkeys(_PROMISE_KEYS, promise) if isinstance(promise, int) else dict(promise)
    if set(values) != set(_PROMISE_KEYS) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values.values()):
        raise ImplementationError(
            f"--impl {spec}: {PROMISE_ATTRIBUTE} = {promise!r} is not valid; expected a non-negative int or "
            f"{{'with_hidden': int, 'without_hidden': int}}")
    return values


def validate_gather(candidate: Any, spec: str) -> Callable[..., Any]:
    """Return ``candidate`` if it can be called as a gather, else raise :class:`ImplementationError`."""
    if not callable(candidate):
        raise ImplementationError(
            f"--impl {spec}: expected a callable {_SIGNATURE}, got a {type(candidate).__name__}")
    try:
        signature = inspect.signature(candidate)
    except (TypeError, ValueError):
        signature = None  # a builtin or extension function without a signature: it is checked when called
    if signature is not None:
        try:
            signature.bind(*range(5))
        except TypeError as error:
            raise ImplementationError(
                f"--impl {spec}: {_describe(candidate)}{signature} cannot be called as {_SIGNATURE} "
                f"with 5 positional arguments ({error})") from None
    _parse_promise(getattr(candidate, PROMISE_ATTRIBUTE, None), spec)
    return candidate


def promised_launches(candidate: Any, *, with_hidden: bool, spec: str = "gather") -> Optional[int]:
    """Kernel launches per call that ``candidate`` promises, or None when it promises nothing."""
    promise = _parse_promise(getattr(candidate, PROMISE_ATTRIBUTE, None), spec)
    if promise is None:
        return None
    return promise["with_hidden" if with_hidden else "without_hidden"]
