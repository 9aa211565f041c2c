"""Process-wide tallies for the run report: largest errors per dtype, and named counters.

The library records here (no pytest import); :mod:`harness.plugin.report` reads, merges and prints them."""

from __future__ import annotations

import collections
from typing import Any

__all__ = ["record_error", "count", "snapshot", "merge", "reset"]

_errors: dict[str, dict[str, float]] = {}
_counters: collections.Counter[str] = collections.Counter()


def record_error(dtype_name: str, *, max_abs_error: float, tolerance_used: float) -> None:
    """Note a tolerance comparison: its largest |actual - expected| and its largest fraction of the
    allowed difference (``|diff| / (atol + rtol * |expected|)``; above 1.0 is a failure)."""
    entry = _errors.setdefault(dtype_name, {"max_abs_error": 0.0, "tolerance_used": 0.0, "comparisons": 0})
    entry["max_abs_error"] = max(entry["max_abs_error"], max_abs_error)
    entry["tolerance_used"] = max(entry["tolerance_used"], tolerance_used)
    entry["comparisons"] += 1


def count(name: str, amount: int = 1) -> None:
    """Add to a named counter (``runner.replays``, ``runner.eager_fallbacks``, ...)."""
    _counters[name] += amount


def snapshot() -> dict[str, Any]:
    """This process's tallies as plain JSON data."""
    return {"errors": {k: dict(v) for k, v in _errors.items()}, "counters": dict(_counters)}


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Tallies of several processes (pytest-xdist workers) combined: maxima of maxima, sums of counts."""
    errors: dict[str, dict[str, float]] = {}
    counters: collections.Counter[str] = collections.Counter()
    for part in parts:
        for dtype_name, entry in part.get("errors", {}).items():
            into = errors.setdefault(dtype_name, {"max_abs_error": 0.0, "tolerance_used": 0.0, "comparisons": 0})
            into["max_abs_error"] = max(into["max_abs_error"], entry["max_abs_error"])
            into["tolerance_used"] = max(into["tolerance_used"], entry["tolerance_used"])
            into["comparisons"] += entry["comparisons"]
        counters.update(part.get("counters", {}))
    return {"errors": errors, "counters": dict(counters)}


def reset() -> None:
    _errors.clear()
    _counters.clear()
