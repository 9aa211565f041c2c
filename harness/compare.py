"""Equivalence checks between an implementation's output and its oracle, and their failure reports.

Safe to use: :func:`assert_equivalent` (compares nested structures leaf by leaf, bitwise or within
:data:`TOLERANCES`, raising :class:`~harness.errors.MismatchError` that says where and by how much),
:func:`tolerance_for` and :func:`bitwise_expected`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from harness import observations
from harness.errors import MismatchError

__all__ = ["Tolerance", "TOLERANCES", "ComputeSettings", "tolerance_for", "bitwise_expected", "assert_equivalent",
           "equivalent", "describe_mismatch", "format_context"]


@dataclasses.dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    why: str


# The one tolerance table. Comparisons that are copies (gathers, writebacks, replays of the same
# kernels on the emulated backend) are bitwise and never consult it. It applies where a replayed
# graph may legitimately pick other kernels or reduction orders than eager (CUDA graphs capture
# cuBLAS workspaces and split-K choices of their own). Keyed by dtype, and by "tf32", the precision
# float32 matmuls compute in under torch.set_float32_matmul_precision("high"): a caller's context may
# lower the precision values are computed in below their dtype (ComputeSettings).
TOLERANCES: dict[torch.dtype | str, Tolerance] = {
    torch.float64: Tolerance(1e-7, 1e-7, "float64 references: only summation order differs"),
    torch.float32: Tolerance(
        1e-5, 1e-5,
        "a replayed stack may pick another GEMM/reduction order than eager; measured |diff| ~1e-6 on "
        "an H200 for tiny layer stacks, so 1e-5 leaves a 10x margin and still catches a wrong buffer",
    ),
    torch.bfloat16: Tolerance(
        1.6e-2, 1e-2,
        "bf16 keeps 8 mantissa bits (eps 7.8e-3); one reordered accumulation can move a value by 1-2 ulp",
    ),
    torch.float16: Tolerance(
        1e-3, 1e-3,
        "fp16 keeps 11 mantissa bits (eps 9.8e-4); reordered accumulation moves values by about 1 ulp",
    ),
    "tf32": Tolerance(
        5e-3, 5e-3,
        "float32 matmuls in TF32 (float32_matmul_precision 'high') round each product to 10 mantissa bits "
        "(eps 9.8e-4); a replay's GEMM at the bucket's shape and eager's at the batch's round differently, "
        "through every layer",
    ),
}


@dataclasses.dataclass(frozen=True)
class ComputeSettings:
    """The settings of a caller's context that lower the precision values are computed in below their dtype:
    float32 matmul precision, and autocast per device type (``{device type: dtype}`` where it is on)."""

    matmul_precision: str = "highest"
    autocast: tuple[tuple[str, torch.dtype], ...] = ()

    @classmethod
    def now(cls) -> ComputeSettings:
        """The settings in force in this thread now."""
        on = []
        for device_type in ("cpu", "cuda"):
            try:
                if torch.is_autocast_enabled(device_type):
                    on.append((device_type, torch.get_autocast_dtype(device_type)))
            except RuntimeError:  # a device type this torch cannot autocast
                continue
        return cls(torch.get_float32_matmul_precision(), tuple(on))

    def computed_in(self, dtype: torch.dtype, device_type: str) -> list[torch.dtype | str]:
        """The table's keys for values of ``dtype`` on ``device_type`` under these settings: the dtype, and each
        lower precision the settings let their computation use."""
        keys: list[torch.dtype | str] = [dtype]
        if dtype == torch.float32 and self.matmul_precision != "highest":
            keys.append("tf32" if self.matmul_precision == "high" else torch.bfloat16)
        if dtype in (torch.float32, torch.float16, torch.bfloat16):
            keys += [lower for kind, lower in self.autocast if kind == device_type]
        return keys


def tolerance_for(dtype: torch.dtype, *, device_type: str = "cpu",
                  settings: ComputeSettings | None = None) -> Tolerance:
    """Tolerance for floating dtypes, the loosest of the precisions ``settings`` (default: none lowered) let their
    computation use; integer, bool and float8 values are compared exactly."""
    keys = (settings or ComputeSettings()).computed_in(dtype, device_type)
    found = [(key, TOLERANCES[key]) for key in keys if key in TOLERANCES]
    if not found:
        return Tolerance(0.0, 0.0, "exact: integer, bool or float8 values")
    if len(found) == 1:
        return found[0][1]
    rtol = max(tol.rtol for _, tol in found)
    atol = max(tol.atol for _, tol in found)
    lowered = ", ".join(str(key).removeprefix("torch.") for key, _ in found[1:])
    return Tolerance(rtol, atol, f"{str(dtype).removeprefix('torch.')} computed in {lowered} under the caller's "
                                 f"context: the loosest of their rows ({'; '.join(tol.why for _, tol in found)})")


def bitwise_expected(*, backend: str, device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether a replay can be held to bitwise equality with eager: the one rule every suite uses.

    Bitwise only on the emulated backend, which replays eager's own kernels, and only in float32
    and float64 (the suites have never held half precision bitwise; it stays on the table). The
    emulated replay is bitwise against eager *at the same shapes*:
    CPU BLAS picks kernels by the row count, so a row of a 2-row product may differ from the same row
    of a 4-row one (measured ~5e-7), and suites that compare against eager at other shapes must
    compare within :data:`TOLERANCES` there. On CUDA a captured GEMM may pick another cuBLAS
    algorithm and workspace than the eager call, so the tolerance table applies on every device the
    cuda backend runs on. ``device`` is part of the key for callers' clarity; the emulated backend
    replays the recorded eager kernels on whatever device it runs, so it does not change the answer.
    """
    del device
    return backend == "emulated" and dtype in (torch.float32, torch.float64)


def format_context(context: Mapping[str, Any] | None) -> str:
    """The context lines appended to every failure message (implementation, seed, reproduce, ...)."""
    if not context:
        return ""
    return "".join(f"\n  {key}: {value}" for key, value in context.items())


def describe_mismatch(actual: torch.Tensor, expected: torch.Tensor, *, exact: bool, where: str = "",
                      settings: ComputeSettings | None = None) -> str | None:
    """Return a message describing how ``actual`` differs from ``expected``, or None when they agree; ``settings``
    are the compute settings the values were made under (default: those in force now)."""
    settings = ComputeSettings.now() if settings is None else settings
    label = f" at {where}" if where else ""
    if not isinstance(actual, torch.Tensor):
        return f"expected a tensor{label}, got {type(actual).__name__}"
    if actual.shape != expected.shape:
        return f"shape mismatch{label}: actual {tuple(actual.shape)} vs expected {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype mismatch{label}: actual {actual.dtype} vs expected {expected.dtype}"
    if actual.device.type != expected.device.type:
        return f"device mismatch{label}: actual {actual.device} vs expected {expected.device}"
    actual_cpu, expected_cpu = actual.detach().cpu(), expected.detach().cpu()
    if actual_cpu.numel() == 0:
        return None
    if exact or not expected.dtype.is_floating_point or expected.dtype not in TOLERANCES:
        if actual_cpu.dtype.is_floating_point and actual_cpu.element_size() == 1:  # float8: compare bits
            actual_cpu, expected_cpu = actual_cpu.view(torch.uint8), expected_cpu.view(torch.uint8)
        # Bitwise for floats: NaNs with the same bits agree, +0.0 and -0.0 do not.
        if actual_cpu.dtype.is_floating_point:
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[actual_cpu.element_size()]
            mismatch = actual_cpu.contiguous().view(bits) != expected_cpu.contiguous().view(bits)
        else:
            mismatch = actual_cpu != expected_cpu
        rtol = atol = 0.0
        mode = "bitwise"
    else:
        tol = tolerance_for(expected.dtype, device_type=expected.device.type, settings=settings)
        rtol, atol = tol.rtol, tol.atol
        close = torch.isclose(actual_cpu, expected_cpu, rtol=rtol, atol=atol, equal_nan=True)
        mismatch = ~close
        mode = f"rtol={rtol:g}, atol={atol:g} ({tol.why})"
    count = int(mismatch.sum())
    if count == 0:
        if mode != "bitwise":  # how close passing results come to the tolerance (a failure reports itself)
            _observe(actual_cpu, expected_cpu, tol)
        return None
    total = mismatch.numel()
    if actual_cpu.dtype == torch.bool:
        diff = (actual_cpu != expected_cpu).to(torch.int64)
    else:
        diff = (actual_cpu.to(torch.float64) - expected_cpu.to(torch.float64)).abs()
    diff = torch.where(mismatch, diff.to(torch.float64), torch.zeros((), dtype=torch.float64))
    flat_index = int(diff.flatten().nan_to_num(float("inf")).argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_index), actual_cpu.shape))
    got, want = actual_cpu[index].item(), expected_cpu[index].item()
    return (
        f"tensors differ{label} ({mode}): {count} / {total} elements mismatch ({100.0 * count / total:.1f}%); "
        f"greatest absolute difference {float(diff.flatten()[flat_index]):.6g} at index {index} "
        f"(actual {got!r}, expected {want!r}); shape {tuple(actual.shape)}, dtype {actual.dtype}"
    )


def _observe(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance) -> None:
    """Feed the run report: the largest error of a passing tolerance comparison, and its share of the
    tolerance. Failing comparisons are left out: tests that expect a mismatch (mutant detectors,
    pytest.raises) would otherwise report their deliberate errors as the run's largest."""
    diff = (actual.to(torch.float64) - expected.to(torch.float64)).abs()
    finite = torch.isfinite(diff)
    if not bool(finite.any()):
        return
    allowed = tol.atol + tol.rtol * expected.to(torch.float64).abs()
    observations.record_error(str(expected.dtype).removeprefix("torch."), max_abs_error=float(diff[finite].max()),
                              tolerance_used=float((diff[finite] / allowed[finite]).max()))


def _walk(actual: Any, expected: Any, *, exact: bool, where: str, problems: list[str],
          settings: ComputeSettings) -> None:
    if isinstance(expected, torch.Tensor):
        message = describe_mismatch(actual, expected, exact=exact, where=where or "output", settings=settings)
        if message:
            problems.append(message)
    elif isinstance(expected, Mapping):
        if not isinstance(actual, Mapping) or set(actual) != set(expected):
            problems.append(f"keys differ at {where or 'output'}: actual {_keys(actual)} vs expected "
                            f"{sorted(map(str, expected))}")
            return
        for key in expected:
            _walk(actual[key], expected[key], exact=exact, where=f"{where}[{key!r}]", problems=problems,
                  settings=settings)
    elif isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            problems.append(f"structure differs at {where or 'output'}: actual {_shape_of(actual)} vs expected "
                            f"{_shape_of(expected)}")
            return
        for i, (a, e) in enumerate(zip(actual, expected)):
            _walk(a, e, exact=exact, where=f"{where}[{i}]", problems=problems, settings=settings)
    elif dataclasses.is_dataclass(expected) and not isinstance(expected, type):
        for field in dataclasses.fields(expected):
            _walk(getattr(actual, field.name, _MISSING), getattr(expected, field.name), exact=exact,
                  where=f"{where}.{field.name}", problems=problems, settings=settings)
    elif actual is _MISSING or not _equal_leaves(actual, expected):
        problems.append(f"values differ at {where or 'output'}: actual {actual!r} vs expected {expected!r}")


_MISSING = object()


def _equal_leaves(actual: Any, expected: Any) -> bool:
    """``actual == expected`` for two leaves; where ``==`` is element-wise (a numpy array), every element equal."""
    equal = actual == expected
    try:
        return bool(equal)
    except (ValueError, RuntimeError):  # an element-wise result has no truth value of its own
        return bool(equal.all())


def _keys(value: Any) -> Any:
    return sorted(map(str, value)) if isinstance(value, Mapping) else type(value).__name__


def _shape_of(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def equivalent(actual: Any, expected: Any, *, exact: bool = False, settings: ComputeSettings | None = None) -> bool:
    """Whether :func:`assert_equivalent` would pass: for choosing an oracle, never as a test's verdict."""
    problems: list[str] = []
    _walk(actual, expected, exact=exact, where="", problems=problems, settings=settings or ComputeSettings.now())
    return not problems


def assert_equivalent(actual: Any, expected: Any, *, exact: bool, context: Mapping[str, Any] | None = None,
                      settings: ComputeSettings | None = None) -> None:
    """Assert that ``actual`` matches ``expected`` leaf by leaf.

    ``exact=True`` compares bits (use it for copies and order-preserving computations);
    ``exact=False`` uses :data:`TOLERANCES` for floating dtypes, at the precision ``settings`` (default: those in
    force now) let the values be computed in, and exact equality for the rest.
    ``context`` is appended to the failure message: put the implementation, the seed, the
    shapes and a reproducing command there.
    """
    __tracebackhide__ = True  # a failure shows the harness's report, not this function's insides
    problems: list[str] = []
    _walk(actual, expected, exact=exact, where="", problems=problems, settings=settings or ComputeSettings.now())
    if problems:
        shown = problems[:5]
        more = f"\n  ... and {len(problems) - 5} more" if len(problems) > 5 else ""
        raise MismatchError("\n".join(shown) + more + format_context(context))
