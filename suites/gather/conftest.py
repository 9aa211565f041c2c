"""Fixtures of the gather suites: one checking helper over the implementation under test.

``gather_function`` (root conftest, from the component table) is the implementation selected with
``--impl gather=SPEC`` (the compiled reference by default). ``check_gather(case)`` runs it on a
case and asserts the whole in-process contract: bit-identical to the eager oracle, no output
aliasing a source, no source modified.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from harness.compare import assert_equivalent, format_context
from harness.gather import (
    BUFFER_NAMES,
    OUTPUT_NAMES,
    GatherCase,
    GatherInputs,
    eager_gather,
    open_recompile_limit,
)


def _storage_ptr(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def assert_contract(actual: Any, inputs: GatherInputs, *, expected: Any, originals: list[Any],
                    context: dict[str, Any]) -> None:
    """Assert outputs equal ``expected`` bitwise, alias no source, and that the sources are unchanged."""
    __tracebackhide__ = True
    assert_equivalent(actual, expected, exact=True, context=context)
    sources = dict(zip(("indices", *BUFFER_NAMES), inputs.args))
    for out_name, out in zip(OUTPUT_NAMES, actual):
        if out is None or out.numel() == 0:
            continue
        for source_name, source in sources.items():
            if source is not None and _storage_ptr(out) == _storage_ptr(source):
                raise AssertionError(
                    f"output {out_name} shares memory with input {source_name}: a gather must return new tensors"
                    + format_context(context))
    assert_equivalent(list(inputs.args), originals, exact=True,
                      context={"problem": "the gather modified an input (indices or a source buffer)", **context})


@pytest.fixture(autouse=True)
def _lifted_recompile_limit() -> Any:
    """Every dtype/layout combination is a new graph for a compiled candidate; under dynamo's
    default limit (8) the ninth would silently run eagerly and the suites would check eager code.
    The stream a real engine sees is checked under the default limit in ``test_compile.py``."""
    with open_recompile_limit():
        yield


@pytest.fixture
def check_gather(gather_function, device, failure_context) -> Callable[..., Any]:
    """``check_gather(case, **details)``: run the candidate on ``case`` and assert the contract."""

    def check(case: GatherCase, **details: Any) -> Any:
        __tracebackhide__ = True
        inputs = case.build(device)
        expected = eager_gather(*inputs.args)
        originals = [None if t is None else t.clone() for t in inputs.args]
        actual = gather_function(*inputs.args)
        assert_contract(actual, inputs, expected=expected, originals=originals,
                        context=failure_context(**case.describe(), **details))
        return actual

    return check


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the kernel-launch counts the launch suite recorded (they travel through xdist)."""
    lines = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            for key, value in getattr(report, "user_properties", ()):
                if key == "gather_launches" and getattr(report, "when", "call") == "call":
                    lines.append(f"{report.nodeid}: {value}")
    if lines:
        terminalreporter.write_sep("-", "gather kernel launches")
        for line in sorted(set(lines)):
            terminalreporter.write_line(line)
