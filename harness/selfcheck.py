"""The mutant kill matrix: every known-bad implementation must fail its component's suites.

Each run is a separate pytest process (``pytest suites/<component> --impl <component>=<spec> -x``):
a mutant may corrupt global state or crash the interpreter, and must not take the check with it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from harness import impls

__all__ = ["Outcome", "run_one", "run_selfcheck", "format_matrix"]

_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Outcome:
    component: str
    spec: str
    kind: str
    verdict: str  # passed / killed / survived / error
    first_failure: str
    seconds: float
    command: str
    bug: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict == ("passed" if self.kind == "reference" else "killed")


def _suite_dir(component: str, root: Path) -> Path:
    return root / "suites" / component


def run_one(impl: impls.Implementation, *, graph_backend: str, device: str, root: Path,
            extra_args: list[str] | None = None, threads: int | None = None) -> Outcome:
    command = [
        sys.executable, "-m", "pytest", str(_suite_dir(impl.component, root)), "-x", "-q", "-p", "no:cacheprovider",
        "-rfE", "--impl", f"{impl.component}={impl.name}", "--graph-backend", graph_backend, "--device", device,
        *(extra_args or []),
    ]
    environment = dict(os.environ)
    environment.setdefault("HYPOTHESIS_PROFILE", "selfcheck")  # ci's examples, no shrinking
    if threads:  # concurrent pytest processes must not each start a full intra-op thread pool
        environment.setdefault("OMP_NUM_THREADS", str(threads))
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=root, env=environment, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    output = completed.stdout + completed.stderr
    failures = _FAILED_LINE.findall(output)
    if completed.returncode == 0:
        verdict = "passed" if impl.kind == "reference" else "survived"
    elif completed.returncode == 1:
        verdict = "killed" if impl.kind != "reference" else "failed"
    else:  # usage error, internal error, interrupted, no tests collected: the check itself is broken
        verdict = "error"
        tail = [line for line in output.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
        failures = failures or [f"pytest exit {completed.returncode}: {tail[0][:160]}"]
    display = " ".join(["pytest", f"suites/{impl.component}", "--impl", f"{impl.component}={impl.name}",
                        "--graph-backend", graph_backend, "--device", device, "-x"])
    return Outcome(impl.component, impl.name, impl.kind, verdict, failures[0] if failures else "", seconds,
                   display, impl.bug)


def run_selfcheck(*, components: list[str], graph_backend: str, device: str, jobs: int,
                  root: Path) -> list[Outcome]:
    candidates = []
    for component in components:
        registered = impls.implementations(component)
        candidates.append(registered["reference"])
        candidates.extend(impl for impl in registered.values() if impl.kind == "mutant")
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        threads = max(1, (os.cpu_count() or 1) // max(1, jobs))
        futures = [pool.submit(run_one, impl, graph_backend=graph_backend, device=device, root=root, threads=threads)
                   for impl in candidates]
        return [future.result() for future in futures]


def format_matrix(outcomes: list[Outcome]) -> str:
    rows = [("component", "implementation", "verdict", "seconds", "first failing test")]
    for outcome in outcomes:
        rows.append((outcome.component, outcome.spec, outcome.verdict + ("" if outcome.ok else "  <-- NOT OK"),
                     f"{outcome.seconds:.1f}", outcome.first_failure or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths)) + "  " + row[4] for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    killed = sum(o.verdict == "killed" for o in outcomes)
    mutants = sum(o.kind == "mutant" for o in outcomes)
    lines.append(f"\n{killed}/{mutants} mutants killed; references "
                 + ", ".join(f"{o.component}={o.verdict}" for o in outcomes if o.kind == "reference"))
    return "\n".join(lines)


def write_json(outcomes: list[Outcome], path: str) -> None:
    Path(path).write_text(json.dumps([dataclasses.asdict(o) for o in outcomes], indent=2) + "\n")
