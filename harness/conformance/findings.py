"""Findings: a conformance report's failures grouped by cause, each with the severity of what the caller got.

A cause is one line: what differed from eager (a fact of the checker, ``harness.oracle``, with where it differed),
or what was raised instead of a result (the error's name and its first line, numbers and addresses left out). One
failing test may show several causes (the checker reports every fact of a call that differed); one cause is one
finding, whatever number of tests and clauses it fails. Severity tiers, worst first:

- ``wrong values``: a result, an input the caller holds, or an earlier result differs from eager's;
- ``wrong state left behind``: module, process or output facts differ (a bound ``forward`` left in a module, the
  random state, an output's strides or autograd facts), or a call went on where it had to raise;
- ``memory or lifetime hazard``: memory kept alive or grown, a read of released memory, a CUDA fault;
- ``loud refusal``: the call raised where eager returned (or raised another error than the contract names);
- ``outside the documented contract``: a failure where the engine's documentation leaves the case undefined.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterable
from typing import Any

__all__ = ["SEVERITIES", "WRONG_VALUES", "WRONG_STATE", "HAZARD", "LOUD_REFUSAL", "OUTSIDE", "Finding",
           "causes_of", "group_findings", "worst"]

WRONG_VALUES = "wrong values"
WRONG_STATE = "wrong state left behind"
HAZARD = "memory or lifetime hazard"
LOUD_REFUSAL = "loud refusal"
OUTSIDE = "outside the documented contract"
SEVERITIES = (WRONG_VALUES, WRONG_STATE, HAZARD, LOUD_REFUSAL, OUTSIDE)

# The checker's facts by what the caller gets; any other fact (module state, rng, a torch setting, an output's
# strides or autograd facts) is state left behind.
_FACT_SEVERITY = {
    "values": WRONG_VALUES,
    "input values": WRONG_VALUES,
    "results outlive the next call": WRONG_VALUES,
    "objects kept alive": HAZARD,
    "growth over a run": HAZARD,
}
# Errors that report memory read after release, out of bounds, or a device fault.
_HAZARD_ERRORS = ("GraphHazardError", "StreamHazardError", "IllegalIndexError", "AcceleratorError")
_CHECKER_HEADLINE = "observably different from eager"


@dataclasses.dataclass
class Finding:
    """One cause: its severity, the clauses it fails (with how many tests each), every test that showed it, and
    the first such failure (node id, message, reproduce line)."""

    cause: str
    severity: str
    clauses: dict[str, int]
    tests: list[str]
    first: dict[str, str]


def worst(severities: Iterable[str]) -> str:
    """The worst of ``severities`` in :data:`SEVERITIES` order; empty when there is none."""
    ranked = sorted(severities, key=SEVERITIES.index)
    return ranked[0] if ranked else ""


def _unwrapped(message: str) -> str:
    """``Name("text") [single exception in FlakyFailure]`` (an error's repr) as ``Name: text``."""
    match = re.match(r"^([\w.]+)\((['\"].*['\"])\)(\s*\[[^\]]*\])?\s*$", message.strip(), re.S)
    if match:
        try:
            return f"{match.group(1)}: {ast.literal_eval(match.group(2))}"
        except (ValueError, SyntaxError):
            pass
    return message


def _normalised(text: str, limit: int = 160) -> str:
    """``text`` without what changes from run to run: addresses, numbers, repeated spaces."""
    text = re.sub(r"0x[0-9a-fA-F]+", "0x…", text)
    text = re.sub(r"(?<![\w.])-?\d+(\.\d+)?(e[-+]?\d+)?(?![\w])", "N", text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# How harness.compare starts a difference it describes; a line of a checker failure that starts so continues the
# fact above it (another path that differs for the same reason).
_DIFFERENCES = ("tensors differ", "keys differ", "structure differs", "values differ", "shape mismatch",
                "dtype mismatch", "device mismatch")


def _where(detail: str) -> str | None:
    """A comparison's difference as its kind and the top of its path (``tensors differ at .next_token_logits``,
    ``shape mismatch at ['replay()']``): one cause, whichever member under it differs."""
    kinds = "|".join(_DIFFERENCES)
    match = re.search(rf"({kinds}) at (\[[^\]]*\]|\.\w+|\S+)", detail)
    return f"{match.group(1)} at {match.group(2)}" if match else None


def _checker_causes(lines: list[str]) -> list[tuple[str, str]]:
    """The facts a checker failure names (the lines before its context, which starts at ``implementations``)."""
    causes = []
    for line in lines[1:]:
        text = line.strip()
        if text.startswith("implementations:"):
            break
        if text.startswith(_DIFFERENCES) or text.startswith("... and "):
            continue
        fact, separator, detail = text.partition(": ")
        if not separator:
            continue
        shown = _where(detail) or _normalised(detail, limit=120)
        causes.append((_FACT_SEVERITY.get(fact, WRONG_STATE), f"{fact}: {shown}"))
    return causes


def causes_of(message: str) -> list[tuple[str, str]]:
    """(severity, cause) for each cause a failure's message shows; one at least."""
    text = _unwrapped(message)
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return [(LOUD_REFUSAL, "failed without a message")]
    first = lines[0]
    name, _, rest = first.partition(": ")
    short_name = name.split(" ", 1)[0].rsplit(".", 1)[-1]
    if _CHECKER_HEADLINE in first:
        causes = _checker_causes(lines)
        if causes:
            return causes
    raised_at = re.search(r"\(raised at ([^)]+)\)", first)
    if short_name.startswith("Failed") and "DID NOT RAISE" in first:
        expected = first.split("DID NOT RAISE", 1)[1].strip()
        return [(WRONG_STATE, f"went on where {expected} had to be raised")]
    if "Regex pattern did not match" in text:
        expected = re.search(r"Expected regex: (.*)", text)
        actual = re.search(r"Actual message: (.*)", text)
        return [(LOUD_REFUSAL, "raised, with a message that does not match "
                 + (expected.group(1).strip() if expected else "the expected one")
                 + (f": {_normalised(actual.group(1), limit=100)}" if actual else ""))]
    if short_name in _HAZARD_ERRORS:
        return [(HAZARD, f"{short_name}: {_normalised(rest, limit=120)}")]
    if short_name == "AssertionError" and raised_at is None:
        return [(WRONG_STATE, _normalised(rest or first, limit=120))]
    if raised_at is not None:
        return [(LOUD_REFUSAL, f"{short_name} raised at {raised_at.group(1)}")]
    if short_name == "TypeError":  # which class's forward misses which argument is one cause: the call form
        rest = re.sub(r"\b\w+\.(\w+\(\))", r"\1", rest)
        rest = re.sub(r"argument: '\w+'", "argument", rest)
    return [(LOUD_REFUSAL, f"{short_name}: {_normalised(rest, limit=120)}" if rest else short_name)]


def group_findings(failures: Iterable[tuple[str, dict[str, Any], bool]]) -> list[Finding]:
    """Findings from ``(clause, failure, outside)`` triples, a failure being the report's dict (``nodeid``,
    ``message``, ``reproduce``) and ``outside`` whether it was outside the engine's documented contract. Worst
    severity first, then most tests, then cause."""
    found: dict[tuple[str, str], Finding] = {}
    for clause, failure, outside in failures:
        for severity, cause in causes_of(failure.get("message", "")):
            severity = OUTSIDE if outside else severity
            finding = found.setdefault((severity, cause), Finding(cause, severity, {}, [], dict(failure)))
            if failure["nodeid"] not in finding.tests:
                finding.tests.append(failure["nodeid"])
            finding.clauses[clause] = finding.clauses.get(clause, 0) + 1
    return sorted(found.values(), key=lambda f: (SEVERITIES.index(f.severity), -len(f.tests), f.cause))
