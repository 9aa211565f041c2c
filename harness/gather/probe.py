"""Run a gather on crash-prone cases in child processes, so a crash cannot take the caller down.

:func:`probe` classifies each case ``correct``, ``raised``, ``wrong data`` or ``crashed``; a child that
dies (or leaves a CUDA context unusable) is replaced for the remaining cases. Child side:
``python -m harness.gather.probe SPEC DEVICE`` with a JSON list of cases on stdin."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import torch

from harness.gather.cases import GatherCase

__all__ = ["OUTCOMES", "ProbeCase", "ProbeResult", "probe", "main"]

OUTCOMES = ("correct", "raised", "wrong data", "crashed")
_START, _RESULT = "GATHER-PROBE-START ", "GATHER-PROBE-RESULT "


@dataclasses.dataclass(frozen=True)
class ProbeCase:
    """A named case; ``valid`` says every index lies in [-pool, pool), so ``correct`` is possible."""

    name: str
    case: GatherCase
    valid: bool


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    outcome: str
    detail: str

    def __str__(self) -> str:
        return f"{self.outcome} ({self.detail})"


def _child_env() -> dict[str, str]:
    # The child must import what the parent imported (an external --impl module, an editable
    # checkout): hand it the parent's import path. It runs on the parent's intra-op thread count (the
    # harness sets 1 on the CPU), which Inductor's CPU kernels and its cache keys depend on: the child then
    # loads the graphs the parent compiled (and the parent the child's) from the Inductor cache.
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *paths])
    env["OMP_NUM_THREADS"] = str(torch.get_num_threads())
    return env


def _run_child(spec: str, device: str, cases: Sequence[ProbeCase], timeout: float,
               results: dict[str, ProbeResult]) -> None:
    payload = json.dumps([{"name": c.name, "case": c.case.to_json(), "valid": c.valid} for c in cases])
    command = [sys.executable, "-m", "harness.gather.probe", spec, device]
    started: str | None = None
    try:
        completed = subprocess.run(command, input=payload, capture_output=True, text=True, timeout=timeout,
                                   env=_child_env())
        stdout, stderr, returncode = completed.stdout, completed.stderr, completed.returncode
    except subprocess.TimeoutExpired as expired:
        stdout = expired.stdout.decode() if isinstance(expired.stdout, bytes) else (expired.stdout or "")
        stderr, returncode = f"the child process hung for more than {timeout:g} s", None
    for line in stdout.splitlines():
        if line.startswith(_START):
            started = line[len(_START):]
        elif line.startswith(_RESULT):
            verdict = json.loads(line[len(_RESULT):])
            results[verdict["name"]] = ProbeResult(verdict["outcome"], verdict["detail"])
            started = None
    if started is not None:
        if returncode is None:
            how = stderr
        else:
            how = (f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}")
            how += ": " + " | ".join(stderr.strip().splitlines()[-4:])
        results[started] = ProbeResult("crashed", f"the child process died on this case ({how})")
    elif not any(c.name in results for c in cases):
        tail = " | ".join((stderr or stdout).strip().splitlines()[-6:])
        raise RuntimeError(f"the gather probe child failed before running any case (exit {returncode}): {tail}")


def probe(spec: str, cases: Sequence[ProbeCase], *, device: str, timeout: float = 300.0) -> dict[str, ProbeResult]:
    """Run implementation ``spec`` (a registered name or ``pkg.mod:attr``) on ``cases`` in child processes.

    On CUDA each invalid case gets a child of its own and the children run at once: a device-side
    assert ends a child's usefulness, and a child costs a CUDA context and a compile (so run one after
    another, the index-domain cases add up). On the CPU one child runs them in order.
    """
    if not device.startswith("cuda"):
        return _probe_in_turn(spec, list(cases), device, timeout)
    groups = [[c for c in cases if c.valid]] + [[c] for c in cases if not c.valid]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(groups)) as pool:
        futures = [pool.submit(_probe_in_turn, spec, group, device, timeout) for group in groups if group]
        return {name: result for future in futures for name, result in future.result().items()}


def _probe_in_turn(spec: str, cases: list[ProbeCase], device: str, timeout: float) -> dict[str, ProbeResult]:
    results: dict[str, ProbeResult] = {}
    remaining = cases
    while remaining:
        _run_child(spec, device, remaining, timeout, results)
        remaining = [c for c in remaining if c.name not in results]
    return results


def _run_case(candidate: Any, device: str, probe_case: ProbeCase) -> dict[str, str]:
    """A valid case runs through :class:`harness.oracle.Checker` beside the eager oracle (values, output metadata
    and aliasing, inputs and process state left behind); an invalid one runs the candidate alone, which must raise."""
    from harness.errors import MismatchError
    from harness.gather.reference import BUFFER_NAMES, eager_gather
    from harness.oracle import check_call

    inputs = probe_case.case.build(device)

    def run() -> Any:
        actual = candidate(*inputs.args)
        if device.startswith("cuda"):
            torch.cuda.synchronize()  # asynchronous kernel errors surface here
        return actual

    try:
        if not probe_case.valid:
            run()
            return {"outcome": "wrong data",
                    "detail": "returned data for indices outside [-pool, pool) instead of raising"}
        check_call("gather", run, lambda: eager_gather(*inputs.args), exact=True,
                   inputs=dict(zip(("indices", *BUFFER_NAMES), inputs.args)))
    except MismatchError as error:
        problems = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
        return {"outcome": "wrong data", "detail": "; ".join(problems)[:400]}
    except Exception as error:  # noqa: BLE001 - classifying the candidate's failure is the point
        first_line = (str(error).strip().splitlines() or [""])[0]
        return {"outcome": "raised", "detail": f"{type(error).__name__}: {first_line[:300]}"}
    return {"outcome": "correct", "detail": "observably the eager oracle (harness.oracle)"}


def main(argv: list[str]) -> int:
    from harness import impls

    spec, device = argv
    candidate = impls.load("gather", spec).obj
    for item in json.loads(sys.stdin.read()):
        probe_case = ProbeCase(item["name"], GatherCase.from_json(item["case"]), item["valid"])
        print(_START + probe_case.name, flush=True)
        verdict = _run_case(candidate, device, probe_case)
        print(_RESULT + json.dumps({"name": probe_case.name, **verdict}), flush=True)
        if verdict["outcome"] == "raised" and device.startswith("cuda") and not _context_usable(device):
            break  # the context is poisoned; the parent starts a fresh child for the rest
    return 0


def _context_usable(device: str) -> bool:
    """Whether CUDA still runs a kernel in this process: after a device-side assert every call fails.
    (Each fresh child costs a CUDA context and a compile: seconds per case.)"""
    try:
        probe_tensor = torch.ones(1, device=device) + 1
        torch.cuda.synchronize()
        return float(probe_tensor.cpu()) == 2.0
    except Exception:  # noqa: BLE001 - any failure here means: start a fresh child
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
