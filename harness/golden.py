"""Golden snapshots (syrupy) as readable JSON, with tensors compared within the dtype tolerance.

:class:`GoldenExtension` writes one JSON file per snapshot under ``golden/``, mirroring
``suites/`` (``suites/runner/test_x.py`` -> ``golden/runner/test_x/<test name>.json``). Plain data
(discovery results, capture plans) is compared exactly. A tensor is stored as its shape, dtype,
summary statistics, its first values and a digest of its bits; matching compares shape and dtype
exactly and the statistics and first values within :func:`harness.compare.tolerance_for` its
dtype, so a GPU may reproduce a CPU golden. The digest is informational (it says whether the bits
changed) and never decides a match. No pickles: every golden is text a reviewer can read.

Update goldens deliberately with ``pytest ... --snapshot-update`` and review the diff.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import torch
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from harness.compare import tolerance_for

__all__ = ["GoldenExtension", "to_golden", "tensor_summary", "golden_matches"]

_TENSOR_KEY = "__tensor__"
_HEAD = 8  # leading values stored per tensor: enough to spot a shifted or permuted result


def tensor_summary(tensor: torch.Tensor) -> dict[str, Any]:
    """Shape, dtype, statistics (in float64), first values and a sha256 of the raw bits."""
    data = tensor.detach().cpu().contiguous()
    values = data.to(torch.float64).flatten() if data.numel() else torch.zeros(0, dtype=torch.float64)
    stats = {}
    if values.numel():
        stats = {
            "mean": float(values.mean()),
            "abs_mean": float(values.abs().mean()),
            "rms": float(values.pow(2).mean().sqrt()),
            "min": float(values.min()),
            "max": float(values.max()),
        }
    return {
        _TENSOR_KEY: {
            "shape": list(data.shape),
            "dtype": str(data.dtype).removeprefix("torch."),
            "stats": stats,
            "head": [float(v) for v in values[:_HEAD]],
            "sha256": hashlib.sha256(data.view(torch.uint8).numpy().tobytes()).hexdigest()
            if data.numel() else "",
        }
    }


def to_golden(value: Any) -> Any:
    """Plain JSON data for ``value``: tensors summarised, dataclasses as dicts, enums as values."""
    if isinstance(value, torch.Tensor):
        return tensor_summary(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_golden(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(key): to_golden(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_golden(item) for item in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, torch.nn.Module):
        return type(value).__name__
    raise TypeError(f"cannot store a {type(value).__name__} in a golden; convert it to plain data first")


def _close(actual: float, expected: float, dtype_name: str) -> bool:
    tol = tolerance_for(getattr(torch, dtype_name, torch.float64))
    return math.isclose(actual, expected, rel_tol=tol.rtol, abs_tol=tol.atol) or actual == expected


def _tensor_matches(actual: dict[str, Any], expected: dict[str, Any]) -> bool:
    if actual["shape"] != expected["shape"] or actual["dtype"] != expected["dtype"]:
        return False
    if set(actual["stats"]) != set(expected["stats"]) or len(actual["head"]) != len(expected["head"]):
        return False
    pairs = [(actual["stats"][k], expected["stats"][k]) for k in expected["stats"]]
    pairs += list(zip(actual["head"], expected["head"]))
    return all(_close(a, e, expected["dtype"]) for a, e in pairs)


def golden_matches(actual: Any, expected: Any) -> bool:
    """Exact for plain data; tensors (``{"__tensor__": ...}``) within their dtype's tolerance."""
    if isinstance(expected, dict) and _TENSOR_KEY in expected:
        return (isinstance(actual, dict) and _TENSOR_KEY in actual
                and _tensor_matches(actual[_TENSOR_KEY], expected[_TENSOR_KEY]))
    if isinstance(expected, dict):
        return isinstance(actual, dict) and set(actual) == set(expected) and all(
            golden_matches(actual[k], expected[k]) for k in expected)
    if isinstance(expected, list):
        return isinstance(actual, list) and len(actual) == len(expected) and all(
            golden_matches(a, e) for a, e in zip(actual, expected))
    return type(actual) is type(expected) and actual == expected


class GoldenExtension(SingleFileSnapshotExtension):
    """Syrupy extension: JSON text files under ``golden/``, tolerance-aware for tensors.

    Safe to override: :meth:`dirname` (where files go) and :meth:`serialize` (what is stored).
    """

    _write_mode = WriteMode.TEXT
    file_extension = "json"

    @classmethod
    def dirname(cls, *, test_location: Any) -> str:
        test_file = Path(test_location.filepath)
        parts = test_file.parts
        if "suites" not in parts:  # a test outside suites/ keeps its goldens next to it
            return str(test_file.parent / "golden" / test_location.basename)
        index = len(parts) - 1 - parts[::-1].index("suites")
        root, inner = Path(*parts[:index]), Path(*parts[index + 1:-1])
        return str(root / "golden" / inner / test_location.basename)

    def serialize(self, data: Any, **_: Any) -> str:
        return json.dumps(to_golden(data), indent=2, sort_keys=True) + "\n"

    def matches(self, *, serialized_data: Any, snapshot_data: Any) -> bool:
        try:
            return golden_matches(json.loads(serialized_data), json.loads(snapshot_data))
        except (TypeError, ValueError):  # not JSON (an old or hand-edited file): compare the text
            return serialized_data == snapshot_data
