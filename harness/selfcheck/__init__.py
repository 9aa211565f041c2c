"""The mutant kill matrix (``python -m harness selfcheck``): every known-bad implementation must fail.

Each run is its own pytest process (mutants forked from :mod:`harness.selfcheck.fork_server`); the
README's Mutants and the self-check section describes the matrix, its golden :data:`KILL_MATRIX_PATH`, this
machine's hints cache :data:`HINTS_CACHE_PATH` and when a mutant counts as killed, skipped or not judged."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness import components, impls
from harness.devices import resolve, use_one_compile_worker
from harness.plugin import child_runs
from harness.selfcheck.fork_server import ForkServer, ForkServerUnavailable
from harness.selfcheck.fork_server import available as fork_server_available

__all__ = ["Outcome", "KILL_MATRIX_PATH", "HINTS_PATH", "HINTS_CACHE_PATH", "default_jobs", "run_one",
           "run_references", "run_selfcheck", "judge", "format_matrix", "write_json", "read_hints", "read_hints_cache",
           "read_slow_kills", "still_running", "hinted_test", "first_tests", "write_kill_matrix", "write_hints",
           "child_environment",
           "fork_server_wanted", "TEST_SECONDS", "PROCESS_SECONDS", "SLOW_KILL_SECONDS", "MUTANT_NICENESS"]

# The kill matrix, a golden: which test kills each mutant, per graph backend, and nothing that depends on the
# machine; relative to the project root. Each mutant's run starts with its test. A run only reads it:
# ``selfcheck --update-kill-matrix`` rewrites it (its killing tests can differ between hypothesis and torch
# versions, so a plain run must not move them).
KILL_MATRIX_PATH = Path("golden") / "selfcheck" / "kill_matrix.json"
HINTS_PATH = KILL_MATRIX_PATH  # its name before the machine's timings moved out of it
# This machine's hints, rewritten by every run and never committed (a folder with its own .gitignore, as
# .pytest_cache): each killed mutant's last killing test and seconds to kill, and whether that kill was slow.
# Missing or unreadable, it is only a slower start; relative to the folder of this machine's state
# (harness.locations.state_dir: a checkout's root, else the folder selfcheck runs from).
HINTS_CACHE_PATH = Path(".harness_cache") / "selfcheck-hints.json"
# Concurrent pytest processes per GPU (never more than the cores): the suites' kernels are tiny, so a
# mutant's run is mostly process start-up, imports and capture on the host; eight share an H200 well.
PROCESSES_PER_GPU = 8
# Time limits of each child: per test (pytest-timeout's --timeout, which a hang inside a hypothesis test
# cannot escape: harness.plugin.timeouts), and for the whole process, which is then stopped with its
# xdist workers. The longest test of the suites takes seconds; a reference's whole suite a few minutes.
TEST_SECONDS = 300.0
PROCESS_SECONDS = 1500.0
# A mutant whose last kill took this long or longer is started before the others: started in registration
# order, the slow kills (rank-pool and child-process tests) began late and were the last runs to end.
SLOW_KILL_SECONDS = 10.0
# Where the references run beside the mutants' slots they are the matrix's longest run (a whole suite each),
# and the mutants' processes, more than there are cores, slowed them. The mutants' processes run at this lower
# CPU priority (a nice value added), so they take the cores the references' session leaves idle.
MUTANT_NICENESS = 10
# A reference's slowest tests kept in its outcome: what bounds the matrix's longest run.
SLOWEST_COUNT = 10


# A reference runs its whole suite, so the references' session is the longest run of the matrix: where
# there are cores to spare it is spread over pytest-xdist workers, this many per reference (one per 4
# cores, at most 4: with the mutants' slots, 20 processes on a 16-core GPU runner).
def reference_workers() -> int:
    return max(1, min(4, (os.cpu_count() or 1) // 4))


@dataclasses.dataclass(frozen=True)
class Outcome:
    component: str
    spec: str
    kind: str
    # passed / killed / survived / failed / error / not judged / timed out / skipped (not run on this backend)
    verdict: str
    first_failure: str
    seconds: float  # the whole process
    command: str
    bug: str = ""
    seconds_to_first_failure: float | None = None
    graph_backend: str = ""
    failures: tuple[str, ...] = ()  # every failing test of the run (a mutant's run stops at its first)
    not_judged_because: str = ""
    launch: str = ""  # fork server / process / process (why the fork server did not run it)
    slowest_tests: tuple[tuple[str, float], ...] = ()  # a reference's: its suite's slowest in the run, seconds

    @property
    def ok(self) -> bool:
        return self.verdict in (("passed",) if self.kind == "reference" else ("killed", "skipped"))


def default_jobs(device: str) -> int:
    """Processes at once: a handful per GPU on a CUDA device (never more than the cores), else the cores."""
    cores = os.cpu_count() or 1
    if device in ("cuda", "auto"):
        import torch

        if torch.cuda.is_available():
            return max(1, min(cores, PROCESSES_PER_GPU * torch.cuda.device_count()))
    return cores


def _read_entries(path: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    if not path.is_file():
        return {}
    return {(e["component"], e["mutant"], e["graph_backend"]): e for e in json.loads(path.read_text())["kills"]}


def read_hints(root: Path) -> dict[tuple[str, str, str], str]:
    """``(component, mutant spec, graph backend) -> killing test node id`` from the kill matrix (the golden)."""
    return {key: entry["killing_test"] for key, entry in _read_entries(root / KILL_MATRIX_PATH).items()}


def _read_cache(path: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    entries = _read_entries(path)
    for entry in entries.values():
        seconds = entry.get("seconds_to_kill", 0.0)
        if not isinstance(entry["killing_test"], str) or not isinstance(seconds, (int, float)):
            raise TypeError(f"an entry of the wrong shape: {entry!r}")
    return entries


_CACHE_ERRORS = (OSError, ValueError, KeyError, TypeError)


def read_hints_cache(root: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """This machine's last observations per ``(component, mutant spec, graph backend)``: ``killing_test``,
    ``seconds_to_kill`` and ``slow``. Missing: empty; unreadable: empty, after one line on stderr (the run
    rewrites it)."""
    path = root / HINTS_CACHE_PATH
    try:
        return _read_cache(path)
    except _CACHE_ERRORS as error:
        print(f"selfcheck: ignoring the unreadable hints cache {path} ({type(error).__name__}: {error}); "
              "this run rewrites it", file=sys.stderr)
        return {}


def read_slow_kills(root: Path) -> set[tuple[str, str, str]]:
    """The ``(component, mutant spec, graph backend)`` whose last kill here took :data:`SLOW_KILL_SECONDS` or more
    (from the hints cache)."""
    return {key for key, entry in read_hints_cache(root).items() if entry.get("slow") is True}


def hinted_test(hints: dict[tuple[str, str, str], str], component: str, mutant: str, graph_backend: str) -> str:
    """The test to run first against ``mutant`` from ``hints`` (the kill matrix's): its killing test on this
    backend, else on another (a new mutant recorded only on the emulated backend usually dies of the same test
    on CUDA, and without a hint it runs its suite in order, up to a rank-pool test); empty without either."""
    if (component, mutant, graph_backend) in hints:
        return hints[component, mutant, graph_backend]
    return next((test for (c, m, _), test in sorted(hints.items()) if (c, m) == (component, mutant)), "")


def first_tests(hints: dict[tuple[str, str, str], str], cached: dict[tuple[str, str, str], dict[str, Any]],
                component: str, mutant: str, graph_backend: str) -> str:
    """``HARNESS_RUN_FIRST`` of a mutant's run: the kill matrix's test (:func:`hinted_test`), then the test that
    killed it last on this machine where that differs (a kill that moved since the matrix was recorded),
    one node id a line; empty without either."""
    observed = {key: entry["killing_test"] for key, entry in cached.items()}
    tests = [hinted_test(hints, component, mutant, graph_backend), observed.get((component, mutant, graph_backend), "")]
    return "\n".join(dict.fromkeys(test for test in tests if test))


def _killed(outcomes: list[Outcome]) -> list[tuple[tuple[str, str, str], Outcome]]:
    return [((o.component, o.spec, o.graph_backend), o) for o in outcomes if o.verdict == "killed" and o.first_failure]


def _write_if_changed(path: Path, text: str) -> None:
    if path.is_file() and path.read_text() == text:
        return  # not even its modification time moves
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_kill_matrix(root: Path, outcomes: list[Outcome]) -> None:
    """Record each killed mutant's killing test in the kill matrix (the golden; ``--update-kill-matrix``).
    Entries of other components, mutants and backends are kept, with their machine-independent fields only."""
    fields = ("component", "mutant", "graph_backend", "killing_test")
    entries = {key: {field: entry[field] for field in fields}
               for key, entry in _read_entries(root / KILL_MATRIX_PATH).items()}
    for key, outcome in _killed(outcomes):
        entries[key] = dict(zip(fields, (*key, outcome.first_failure)))
    _write_if_changed(root / KILL_MATRIX_PATH, json.dumps(
        {"about": "the test that kills each mutant, per graph backend; selfcheck runs it first. Rewritten only by "
                  "python -m harness selfcheck --update-kill-matrix (review its diff like a golden); this "
                  f"machine's timings are in {HINTS_CACHE_PATH.as_posix()}",
         "kills": [entries[key] for key in sorted(entries)]}, indent=2) + "\n")


def write_hints(root: Path, outcomes: list[Outcome]) -> None:
    """Record in the hints cache each killed mutant's killing test, seconds to kill, and whether that kill was
    slow (:data:`SLOW_KILL_SECONDS`); entries of other components and backends are kept. A cache that cannot be
    written costs one line on stderr, never the run."""
    path = root / HINTS_CACHE_PATH
    try:
        entries = _read_cache(path)
    except _CACHE_ERRORS:  # said when the run read it
        entries = {}
    for key, outcome in _killed(outcomes):
        seconds = outcome.seconds if outcome.seconds_to_first_failure is None else outcome.seconds_to_first_failure
        entries[key] = dict(zip(("component", "mutant", "graph_backend"), key), killing_test=outcome.first_failure,
                            seconds_to_kill=round(seconds, 1), slow=seconds >= SLOW_KILL_SECONDS)
    try:
        _write_if_changed(path.parent / ".gitignore", "# written by python -m harness selfcheck: never committed\n*\n")
        _write_if_changed(path, json.dumps(
            {"about": "this machine's selfcheck hints, rewritten by every run (safe to delete): the test that killed "
                      f"each mutant last and its seconds to kill; slow: {SLOW_KILL_SECONDS:g} s or more, so "
                      "selfcheck starts the mutant first",
             "kills": [entries[key] for key in sorted(entries)]}, indent=2) + "\n")
    except OSError as error:
        print(f"selfcheck: could not write the hints cache {path} ({error})", file=sys.stderr)


def child_environment(*, threads: int | None = None) -> dict[str, str]:
    """The environment every child of a run shares (a fork server is started with it); each run adds the
    variables of :data:`harness.selfcheck.fork_server.PER_RUN_VARIABLES`. They run in the suites' root:
    ``PYTHONPATH`` is made absolute (:func:`harness.plugin.child_runs.child_environment`)."""
    environment = child_runs.child_environment()
    environment.setdefault("HYPOTHESIS_PROFILE", "ci")  # no shrinking: the first failure is the verdict
    if threads:  # concurrent pytest processes must not each start a full intra-op thread pool
        environment.setdefault("OMP_NUM_THREADS", str(threads))
    # Nor a pool of inductor compile workers each (the fork server imports Inductor before any child's
    # harness plugin could say so).
    use_one_compile_worker(environment)
    return environment


def run_one(impl: impls.Implementation, *, graph_backend: str, device: str, root: Path,
            extra_args: list[str] | None = None, threads: int | None = None, first: str = "",
            test_timeout: float | None = TEST_SECONDS, process_timeout: float | None = PROCESS_SECONDS,
            environment: dict[str, str] | None = None, fork_server: ForkServer | None = None,
            niceness: int = 0) -> Outcome:
    """Run ``impl`` against its component's suite in a child pytest process, ``first`` (a node id) first,
    each test under ``test_timeout`` seconds and the process under ``process_timeout`` (None: no limit).

    ``environment`` is what the children of one matrix share (default: :func:`child_environment`). A
    mutant's child is forked from ``fork_server`` where one is given (and serves this run; it has its own
    priority), else started as a plain process with ``niceness`` added to its nice value; a reference runs
    as :func:`run_references` runs it."""
    options: dict[str, Any] = dict(graph_backend=graph_backend, device=device, root=root, extra_args=extra_args,
                                   test_timeout=test_timeout, process_timeout=process_timeout,
                                   environment=environment if environment is not None
                                   else child_environment(threads=threads))
    if impl.kind == "reference":
        return run_references([impl], workers=reference_workers(), **options)[0]
    (outcome,) = _run_together([impl], first=first, fork_server=fork_server, workers=1, niceness=niceness, **options)
    return outcome


def run_references(references: list[impls.Implementation], *, workers: int, graph_backend: str, device: str,
                   root: Path, environment: dict[str, str], extra_args: list[str] | None = None,
                   test_timeout: float | None = TEST_SECONDS,
                   process_timeout: float | None = PROCESS_SECONDS) -> list[Outcome]:
    """Run the references of several components as one pytest session over ``workers`` xdist workers
    (1: none), one outcome each. One session lets xdist balance the suites' tests over all its workers,
    where one session per suite leaves the longest suite on its own share of them at the end.

    A reference passes when no failing test lies in its suite (a failure elsewhere in the session is
    another component's); each outcome's seconds are the whole session's."""
    return _run_together(references, first="", fork_server=None, workers=workers, graph_backend=graph_backend,
                         device=device, root=root, environment=environment, extra_args=extra_args,
                         test_timeout=test_timeout, process_timeout=process_timeout)


def _run_together(impl_list: list[impls.Implementation], *, first: str, fork_server: ForkServer | None,
                  workers: int, graph_backend: str, device: str, root: Path, environment: dict[str, str],
                  extra_args: list[str] | None, test_timeout: float | None,
                  process_timeout: float | None, niceness: int = 0) -> list[Outcome]:
    """One pytest process for ``impl_list`` (one mutant, or references), its outcomes in that order."""
    suites = {impl.component: components.get_component(impl.component).suite for impl in impl_list}
    is_mutant = any(impl.kind != "reference" for impl in impl_list)
    assert not is_mutant or len(impl_list) == 1, "a mutant runs alone: its first failure is its verdict"
    environment = dict(environment)
    environment["HARNESS_RUN_FIRST"] = first if is_mutant else ""
    environment["HARNESS_EXIT_ON_FIRST_FAILURE"] = "1" if is_mutant else ""
    with tempfile.TemporaryDirectory() as scratch, _in_flight(impl_list, Path(scratch)):
        report_log = Path(scratch) / "reports.jsonl"
        command = child_runs.pytest_command(
            (root / suite for suite in suites.values()), root=root, plugin="harness.selfcheck.plugin",
            report_log=report_log,
            arguments=[*(["-x"] if is_mutant else []),
                       *(f"--impl={impl.component}={impl.name}" for impl in impl_list),
                       f"--graph-backend={graph_backend}", f"--device={device}",
                       *([f"--timeout={test_timeout:g}"] if test_timeout else []), *(extra_args or []),
                       *([f"--numprocesses={workers}"] if workers > 1 else [])])
        returncode, output, seconds, launch, started_at = _launch(
            command, environment, cwd=root, time_limit=process_timeout, scratch=Path(scratch),
            fork_server=fork_server, niceness=niceness, report_log=report_log)
        entries = child_runs.read_report_log(report_log)
    every_failure = child_runs.failed_nodeids(entries)
    first_failure = next((entry for entry in child_runs.phase_reports(entries) if entry["outcome"] == "failed"), None)
    seconds_to_first_failure = (round(first_failure["stop"] - started_at, 2)
                                if first_failure and first_failure.get("stop") else None)
    slowest = _slowest(entries)
    backend = resolve(device=device, graph_backend=graph_backend).graph_backend
    # A failure that lies in none of the session's suites (a crash before any test, a broken plugin)
    # may be any component's: it counts against each of them.
    stray = [nodeid for nodeid in every_failure if not any(_in_suite(nodeid, suite) for suite in suites.values())]
    failed_silently = returncode == 1 and not every_failure  # exit 1 without naming a test
    outcomes = []
    for impl in impl_list:
        suite = suites[impl.component]
        failures = [nodeid for nodeid in every_failure if _in_suite(nodeid, suite)] + stray
        if returncode is None and not failures:
            verdict = "timed out"
            failures = [f"no verdict within the process limit of {process_timeout:g} s (--process-timeout); "
                        "the process and its workers were stopped"]
        elif returncode == 0 or (returncode == 1 and not failures and not failed_silently):
            verdict = "passed" if impl.kind == "reference" else "survived"
        elif returncode in (1, None):  # None: a test had failed before the process ran out of time
            verdict = "killed" if impl.kind != "reference" else "failed"
        else:  # usage error, internal error, interrupted, no tests collected: the check itself is broken
            verdict = "error"
            shown = child_runs.why_it_did_not_run(output, last=1)
            failures = failures or [f"pytest exit {returncode}: " + " | ".join(line[:160] for line in shown)]
        display = " ".join(["pytest", suite, "--impl", f"{impl.component}={impl.name}",
                            "--graph-backend", graph_backend, "--device", device, "-x"])
        outcomes.append(Outcome(impl.component, impl.name, impl.kind, verdict, failures[0] if failures else "",
                                seconds, display, impl.bug,
                                seconds_to_first_failure if first_failure and first_failure["nodeid"] in failures
                                else None, backend,
                                tuple(failures), launch=launch,
                                slowest_tests=tuple(entry for entry in slowest if _in_suite(entry[0], suite))))
    return outcomes


def _in_suite(nodeid: str, suite: str) -> bool:
    return nodeid == suite or nodeid.startswith(suite + "/")


def _slowest(entries: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """The run's slowest tests, with the seconds of their setup, call and teardown, slowest first."""
    seconds: dict[str, float] = {}
    for entry in child_runs.phase_reports(entries):
        seconds[entry["nodeid"]] = seconds.get(entry["nodeid"], 0.0) + entry.get("duration", 0.0)
    ranked = sorted(seconds.items(), key=lambda item: -item[1])[:SLOWEST_COUNT]
    return [(nodeid, round(total, 2)) for nodeid, total in ranked]


_RUNNING: dict[int, tuple[str, float, Path]] = {}  # id -> (what runs, since when, its scratch folder)


@contextlib.contextmanager
def _in_flight(impl_list: list[impls.Implementation], scratch: Path) -> Iterator[None]:
    key = id(scratch)
    _RUNNING[key] = (", ".join(f"{impl.component} {impl.name}" for impl in impl_list), time.monotonic(), scratch)
    try:
        yield
    finally:
        _RUNNING.pop(key, None)


def still_running() -> list[str]:
    """A line for each run in flight: what runs, for how long, and the last test phase its report log holds
    (so a matrix stopped from outside says which test of which run it was in)."""
    lines = []
    for what, since, scratch in sorted(list(_RUNNING.values()), key=lambda run: run[1]):
        phases = child_runs.phase_reports(child_runs.read_report_log(scratch / "reports.jsonl"))
        last = phases[-1] if phases else None
        where = (f"last reported: {last['nodeid']} {last['when']} {last['outcome']}" if last
                 else "no test phase reported yet")
        lines.append(f"still running after {time.monotonic() - since:.0f} s: {what}; {where}")
    return lines


def _launch(command: list[str], environment: dict[str, str], *, cwd: Path, time_limit: float | None,
            scratch: Path, fork_server: ForkServer | None, report_log: Path,
            niceness: int = 0) -> tuple[int | None, str, float, str, float]:
    """Start one run and wait for it: from ``fork_server`` where it serves the run, else as a plain process
    (:func:`harness.plugin.child_runs.run`). Returns the exit status (None: stopped at ``time_limit``), its
    output, the seconds it took, how it was started ("fork server", "process", or "process (why the fork
    server did not run it)"), and when it started (:func:`time.time`, to time the report log's entries)."""
    launch = "process"
    if fork_server is not None:
        stdout, stderr = scratch / "stdout", scratch / "stderr"
        try:
            fork_server.wait_ready()  # its imports are the matrix's, not this run's: they are not timed
            started_at, started = time.time(), time.perf_counter()
            returncode = fork_server.run(command, environment=environment, cwd=cwd, time_limit=time_limit,
                                         stdout=stdout, stderr=stderr)
            output = "".join(path.read_text(errors="replace") for path in (stdout, stderr) if path.is_file())
            return returncode, output, time.perf_counter() - started, "fork server", started_at
        except ForkServerUnavailable as unavailable:
            launch = f"process ({unavailable})"
            report_log.unlink(missing_ok=True)  # a dead server's child's
    started_at = time.time()
    finished = child_runs.run(command, cwd=cwd, environment=environment, time_limit=time_limit, niceness=niceness)
    return finished.returncode, finished.output, finished.seconds, launch, started_at


def judge(outcomes: list[Outcome]) -> list[Outcome]:
    """Withdraw the verdicts that prove nothing: a mutant of a component whose reference did not pass
    its suite in the same run (same backend, device and profile) is "not judged", as is a mutant whose
    first failure the reference also fails."""
    references = {o.component: o for o in outcomes if o.kind == "reference"}
    judged = []
    for outcome in outcomes:
        reference = references.get(outcome.component)
        reason = ""
        if outcome.kind != "reference" and reference is not None:
            if reference.verdict != "passed":
                reason = f"the {outcome.component} reference {reference.verdict} its suite"
            elif outcome.first_failure and outcome.first_failure in reference.failures:
                reason = f"the reference also fails {outcome.first_failure}"
        judged.append(dataclasses.replace(outcome, verdict="not judged", not_judged_because=reason) if reason
                      else outcome)
    return judged


def run_selfcheck(*, components: list[str], graph_backend: str, device: str, jobs: int | None,
                  root: Path, state: Path | None = None, test_timeout: float | None = TEST_SECONDS,
                  process_timeout: float | None = PROCESS_SECONDS, fork_server: bool = True,
                  on_finished: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """The reference and every mutant of each component, ``jobs`` processes at once (limits: :func:`run_one`).
    ``on_finished`` is called with each run's outcome as it ends, before judging (from a worker thread): a
    run stopped from outside still shows what had finished.

    With ``fork_server`` (and where the platform forks, and ``HARNESS_FORK_SERVER`` is not ``0``), the
    mutants' children are forked from one warm process that has imported the libraries they all need
    (:mod:`harness.selfcheck.fork_server`); the references always start as plain processes. Mutants whose last
    kill was slow here (:data:`SLOW_KILL_SECONDS`, from the hints cache :data:`HINTS_CACHE_PATH`) start first,
    the slowest first; where the references run beside the mutants' slots, the mutants run at a lower CPU
    priority (:data:`MUTANT_NICENESS`). The hints cache is read in ``state`` (default: ``root``)."""
    placement = resolve(device=device, graph_backend=graph_backend)  # the children get what it resolved to
    device, graph_backend = placement.device_type, placement.graph_backend
    backend = graph_backend
    jobs = jobs or default_jobs(device)
    hints, cached = read_hints(root), read_hints_cache(root if state is None else state)
    references, mutants, skipped = [], [], []
    for component in components:
        registered = impls.implementations(component)
        references.append(registered["reference"])
        mutants.extend(impl for impl in registered.values() if impl.kind == "mutant" and impl.judged_on(backend))
        skipped += [Outcome(impl.component, impl.name, impl.kind, "skipped",
                            f"not judged on {backend}: judged on {', '.join(sorted(impl.backends))} only", 0.0, "",
                            impl.bug, None, backend)
                    for impl in registered.values() if impl.kind == "mutant" and not impl.judged_on(backend)]
    # Started: this machine's slow kills first, slowest first (else as registered); reported as registered.
    def slow_first(impl: impls.Implementation) -> tuple[bool, float]:
        last = cached.get((impl.component, impl.name, backend), {})
        slow = last.get("slow") is True
        return not slow, -last.get("seconds_to_kill", 0.0) if slow else 0.0

    start_order = sorted(mutants, key=slow_first)
    cores = os.cpu_count() or 1
    # Where references are spread over xdist workers they run beside the mutants' slots, not in them:
    # a reference holding a slot for its whole suite would leave the mutants few slots on a GPU machine.
    beside = reference_workers() > 1
    processes = jobs + len(references) * reference_workers() if beside else jobs
    niceness = MUTANT_NICENESS if beside else 0
    threads = max(1, cores // max(1, processes))
    # One environment for every child, taken once: the server imports under it, and this process's own
    # variables may change meanwhile (torch's inductor sets TORCHINDUCTOR_CACHE_DIR when first asked).
    environment = child_environment(threads=threads)
    server = (ForkServer(environment=environment, cwd=root, niceness=niceness)
              if mutants and fork_server_wanted(fork_server) else None)

    def announce(done: concurrent.futures.Future) -> None:
        if on_finished is None or done.exception() is not None:  # an exception surfaces from result() below
            return
        result = done.result()  # one mutant's outcome, or the references' list
        for outcome in result if isinstance(result, list) else [result]:
            on_finished(outcome)

    def reported(future: concurrent.futures.Future) -> concurrent.futures.Future:
        future.add_done_callback(announce)
        return future

    def submit(pool: concurrent.futures.Executor, impl: impls.Implementation) -> Any:
        return reported(pool.submit(
            run_one, impl, graph_backend=graph_backend, device=device, root=root, threads=threads,
            first=first_tests(hints, cached, impl.component, impl.name, backend), environment=environment,
            test_timeout=test_timeout, process_timeout=process_timeout, fork_server=server,
            niceness=niceness if impl.kind == "mutant" else 0))

    try:
        if not beside:
            # References run whole suites: start them first, in the same slots, so they do not finish last.
            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                futures = {id(impl): submit(pool, impl) for impl in references + start_order}
                return judge([futures[id(impl)].result() for impl in references + mutants]) + skipped
        # The references as one session over all their workers, beside the mutants' slots.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as reference_pool, \
                concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as mutant_pool:
            reference_run = reported(reference_pool.submit(
                run_references, references, workers=len(references) * reference_workers(),
                graph_backend=graph_backend, device=device, root=root, environment=environment,
                test_timeout=test_timeout, process_timeout=process_timeout))
            futures = {id(impl): submit(mutant_pool, impl) for impl in start_order}
            return judge(reference_run.result() + [futures[id(impl)].result() for impl in mutants]) + skipped
    finally:
        if server is not None:
            server.close()


def fork_server_wanted(requested: bool = True) -> bool:
    """Whether mutants run from a fork server: asked for, not switched off by ``HARNESS_FORK_SERVER=0``,
    and possible here (a platform without ``os.fork`` starts plain processes)."""
    return requested and os.environ.get("HARNESS_FORK_SERVER", "1") != "0" and fork_server_available()


def format_matrix(outcomes: list[Outcome]) -> str:
    """The matrix as a table; references that failed, and what that leaves unjudged, come first."""
    preamble = []
    for reference in (o for o in outcomes if o.kind == "reference" and o.verdict != "passed"):
        unjudged = sum(o.component == reference.component and o.verdict == "not judged" for o in outcomes)
        shown = ", ".join(reference.failures[:5]) + (f" and {len(reference.failures) - 5} more"
                                                      if len(reference.failures) > 5 else "")
        preamble.append(f"REFERENCE {reference.verdict.upper()}: {reference.component} ({reference.command}) fails "
                        f"{shown or 'its suite'}; its {unjudged} mutants are not judged")
    rows = [("component", "implementation", "verdict", "to kill", "total", "first failing test")]
    for outcome in outcomes:
        to_kill = "-" if outcome.seconds_to_first_failure is None else f"{outcome.seconds_to_first_failure:.1f}"
        rows.append((outcome.component, outcome.spec, outcome.verdict + ("" if outcome.ok else "  <-- NOT OK"),
                     to_kill, f"{outcome.seconds:.1f}", outcome.first_failure or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row[:5], widths)) + "  " + row[5] for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    if preamble:
        lines[:0] = preamble + [""]
    fell_back = [o for o in outcomes if o.launch.startswith("process (")]
    if fell_back:  # slower, not wrong: each of these ran as a plain process, as a reference does
        lines.append(f"\n{len(fell_back)} mutant runs started as plain processes, not from the fork server: "
                     f"{fell_back[0].launch.removeprefix('process (').removesuffix(')')}")
    killed = sum(o.verdict == "killed" for o in outcomes)
    mutants = sum(o.kind == "mutant" and o.verdict != "skipped" for o in outcomes)
    skipped = sum(o.verdict == "skipped" for o in outcomes)
    unjudged = sum(o.verdict == "not judged" for o in outcomes)
    kill_times = sorted(o.seconds_to_first_failure for o in outcomes
                        if o.verdict == "killed" and o.seconds_to_first_failure is not None)
    median = f"; median seconds to kill {kill_times[len(kill_times) // 2]:.1f}" if kill_times else ""
    counted = f"{killed}/{mutants} mutants killed" if not unjudged else (
        f"{killed} of {mutants} mutants killed, {unjudged} NOT JUDGED (their reference failed)")
    if skipped:
        counted += f" ({skipped} not judged on this graph backend: skipped)"
    lines.append(f"\n{counted}{median}; references "
                 + ", ".join(f"{o.component}={o.verdict} ({o.seconds:.0f} s)" for o in outcomes
                             if o.kind == "reference"))
    slowest = sorted((entry for o in outcomes if o.kind == "reference" for entry in o.slowest_tests),
                     key=lambda entry: -entry[1])[:5]
    if slowest:  # what bounds the references' run, and with it most matrices
        lines.append("slowest tests of the references: "
                     + ", ".join(f"{nodeid} ({seconds:.1f} s)" for nodeid, seconds in slowest))
    return "\n".join(lines)


def write_json(outcomes: list[Outcome], path: str, *, wall_seconds: float | None = None) -> None:
    document = {"wall_seconds": wall_seconds, "outcomes": [dataclasses.asdict(o) for o in outcomes]}
    Path(path).write_text(json.dumps(document, indent=2) + "\n")
