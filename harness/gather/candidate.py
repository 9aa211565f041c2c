"""What a gather implementation must look like, checked when it is loaded (``--impl gather=...``).

A callable of the five buffers returning four results, optionally with ``promised_kernel_launches``
(an int or ``{"with_hidden": int, "without_hidden": int}``); ``docs/gather.md`` has the details."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from harness.errors import ImplementationError
from harness.impls import check_signature, require_callable

__all__ = ["PROMISE_ATTRIBUTE", "validate_gather", "promised_launches"]

PROMISE_ATTRIBUTE = "promised_kernel_launches"
_SIGNATURE = "gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf)"
_PROMISE_KEYS = ("with_hidden", "without_hidden")


def _parse_promise(promise: Any, spec: str) -> dict[str, int] | None:
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


def validate_gather(candidate: Any, spec: str, *, smoke: bool = True) -> Callable[..., Any]:
    """Return ``candidate`` if it can be called as a gather, else raise :class:`ImplementationError`.

    The check is the signature and the launch promise; ``smoke`` is accepted for the validator
    contract but no call is made: a gather is typically ``torch.compile``d, and a first call at
    load time would compile (seconds, and a C++ toolchain on the CPU) at shapes the suites never use.
    """
    require_callable(candidate, spec, f"a callable {_SIGNATURE}")
    check_signature(candidate, spec, f"{_SIGNATURE} with 5 positional arguments", *range(5))
    _parse_promise(getattr(candidate, PROMISE_ATTRIBUTE, None), spec)
    return candidate


def promised_launches(candidate: Any, *, with_hidden: bool, spec: str = "gather") -> int | None:
    """Kernel launches per call that ``candidate`` promises, or None when it promises nothing."""
    promise = _parse_promise(getattr(candidate, PROMISE_ATTRIBUTE, None), spec)
    if promise is None:
        return None
    return promise["with_hidden" if with_hidden else "without_hidden"]
