"""Run one gather on one case in a child process, so a crash cannot take the caller down.

Out-of-range or negative indices can make an unchecked kernel read or write outside a buffer:
a segfault on the CPU, a poisoned context on CUDA. :func:`probe` runs the candidate in a fresh
interpreter and classifies what it did:

``correct``    returned the oracle's result, bit for bit (a valid index set);
``raised``     raised an exception (a device-side assert counts: it surfaces as one);
``wrong data`` returned something else, or returned anything at all for an invalid index set;
``crashed``    the process died or hung.

Run as ``python -m harness.gather.probe SPEC DEVICE CASE_JSON``; prints one JSON line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any, Optional

from harness.gather.cases import GatherCase

__all__ = ["OUTCOMES", "ProbeResult", "probe", "main"]

OUTCOMES = ("correct", "raised", "wrong data", "crashed")
_MARK = "GATHER-PROBE-RESULT "


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    outcome: str
    detail: str
    returncode: int

    def __str__(self) -> str:
        return f"{self.outcome}: {self.detail}"


def _child_env() -> dict[str, str]:
    # The child must import what the parent imported (an external --impl module, an editable
    # checkout): hand it the parent's import path.
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *paths])
    return env


def probe(spec: str, case: GatherCase, *, device: str, valid: bool, timeout: float = 240.0) -> ProbeResult:
    """Run implementation ``spec`` of the gather on ``case`` in a child process.

    ``valid`` says whether every index of the case lies in [-pool, pool): only then can the
    result be ``correct``; otherwise returning any data is ``wrong data``.
    """
    command = [sys.executable, "-m", "harness.gather.probe", spec, device, json.dumps(case.to_json()),
               "valid" if valid else "invalid"]
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=_child_env())
    except subprocess.TimeoutExpired:
        return ProbeResult("crashed", f"the child process hung for more than {timeout:g} s", -1)
    for line in completed.stdout.splitlines():
        if line.startswith(_MARK):
            result = json.loads(line[len(_MARK):])
            return ProbeResult(result["outcome"], result["detail"], completed.returncode)
    tail = (completed.stderr or completed.stdout).strip().splitlines()[-6:]
    how = (f"killed by signal {-completed.returncode}" if completed.returncode < 0
           else f"exit status {completed.returncode}")
    return ProbeResult("crashed", f"the child process died ({how}) without a verdict: " + " | ".join(tail),
                       completed.returncode)


def _run(spec: str, device: str, case: GatherCase, valid: bool) -> dict[str, Any]:
    import torch

    from harness import impls
    from harness.compare import assert_equivalent
    from harness.errors import MismatchError
    from harness.gather.reference import eager_gather

    candidate = impls.load("gather", spec).obj
    inputs = case.build(device)
    expected: Optional[Any] = None
    if valid:
        expected = eager_gather(*case.build("cpu").args)
    try:
        actual = candidate(*inputs.args)
        if device.startswith("cuda"):
            torch.cuda.synchronize()  # asynchronous kernel errors surface here
    except Exception as error:  # noqa: BLE001 - classifying the candidate's failure is the point
        first_line = (str(error).strip().splitlines() or [""])[0]
        return {"outcome": "raised", "detail": f"{type(error).__name__}: {first_line[:300]}"}
    if not valid:
        return {"outcome": "wrong data",
                "detail": "returned data for indices outside [-pool, pool) instead of raising"}
    try:
        actual_cpu = [None if t is None else t.cpu() for t in actual]
        assert_equivalent(tuple(actual_cpu), expected, exact=True)
    except MismatchError as error:
        return {"outcome": "wrong data", "detail": str(error).splitlines()[0][:400]}
    except Exception as error:  # noqa: BLE001 - a malformed result is wrong data too
        return {"outcome": "wrong data", "detail": f"malformed result ({type(error).__name__}: {error})"[:400]}
    return {"outcome": "correct", "detail": "bit-identical to the eager oracle"}


def main(argv: list[str]) -> int:
    spec, device, case_json, validity = argv
    result = _run(spec, device, GatherCase.from_json(json.loads(case_json)), validity == "valid")
    print(_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
