"""``python -m harness`` (also ``graph-harness``): ``list``, ``selfcheck``, ``bench``, ``report``, ``conformance``,
``conformance-diff``, ``mutate``.

:func:`build_parser` defines every subcommand and its options (``--help`` shows them); :func:`main` is
the entry point."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from harness import components, impls, locations, selfcheck
from harness.devices import BACKEND_CHOICES, DEVICE_CHOICES, resolve
from harness.errors import HarnessError

__all__ = ["build_parser", "main"]


def _chosen_components(arguments: argparse.Namespace) -> list[str]:
    available = list(impls.components())
    chosen = arguments.component or available
    unknown = [c for c in chosen if c not in available]
    if unknown:
        raise HarnessError(f"unknown component(s) {', '.join(unknown)}; known: {', '.join(available)}")
    return chosen


def _list(arguments: argparse.Namespace) -> int:
    """Print each component of the table: reference, oracle, suite, doc, and its mutants with their bugs."""
    for name in _chosen_components(arguments):
        row = components.get_component(name)
        print(f"{row.name}: {row.summary}")
        fields = [("reference", f"{row.reference}  (--impl {row.name}=reference, the default)"),
                  ("oracle", row.oracle), ("suite", row.suite), ("doc", row.doc)]
        fields += [("also", f"{target}  (--impl {row.name}={alias})") for alias, target in row.also_registered.items()]
        fields += [("adapter", f"{target}  (--impl {row.name}={name}, the engine's shipped code)")
                   for name, target in row.adapters.items()]
        for label, value in fields:
            print(f"  {label:<10} {value}")
        mutants = impls.mutants(name)
        print(f"  mutants    {len(mutants)}, each selected by --impl {row.name}=mutant:NAME; "
              "the suite must kill every one:")
        width = max((len(m.name) for m in mutants), default=0)
        for mutant in mutants:
            print(f"    {mutant.name.removeprefix('mutant:'):<{width - len('mutant:')}}  {mutant.bug}")
        print()
    print("Your own implementation: --impl COMPONENT=package.module:attribute (see each doc for the interface).")
    return 0


def _check_device(arguments: argparse.Namespace) -> None:
    """Ask for a GPU once, here, rather than in every child process of the matrix."""
    resolve(device=arguments.device, graph_backend=arguments.graph_backend)


def _selfcheck(arguments: argparse.Namespace) -> int:
    chosen = _chosen_components(arguments)
    _check_device(arguments)
    root = locations.project_root()  # the checkout, or the installed package: it runs from any directory
    if arguments.update_kill_matrix and not locations.is_checkout():
        raise HarnessError(f"--update-kill-matrix rewrites a checkout's {selfcheck.KILL_MATRIX_PATH.as_posix()}; this "
                           f"harness is installed ({root}), whose kill matrix stays as shipped")
    state = locations.state_dir()  # the hints cache: a checkout's, else the engine's folder, never the package
    started = time.perf_counter()
    _report_runs_in_flight_when_stopped()
    outcomes = selfcheck.run_selfcheck(components=chosen, graph_backend=arguments.graph_backend,
                                       device=arguments.device, jobs=arguments.jobs, root=root, state=state,
                                       test_timeout=arguments.test_timeout or None,
                                       process_timeout=arguments.process_timeout or None,
                                       fork_server=not arguments.no_fork_server,
                                       on_finished=_progress_printer(started))
    wall = time.perf_counter() - started
    print(selfcheck.format_matrix(outcomes))
    print(f"whole matrix: {wall:.0f} s")
    if arguments.json:
        selfcheck.write_json(outcomes, arguments.json, wall_seconds=round(wall, 1))
    moved = _kill_matrix_changes(root, outcomes, check=arguments.check_kill_matrix,
                                 update=arguments.update_kill_matrix)
    if arguments.update_kill_matrix:  # refused above where the harness is installed
        selfcheck.write_kill_matrix(root, outcomes)
    if not arguments.keep_hints:
        selfcheck.write_hints(state, outcomes)
    return 0 if all(o.ok for o in outcomes) and not (moved and arguments.check_kill_matrix) else 1


def _report_runs_in_flight_when_stopped() -> None:
    """Stopped from outside (a CI step's limit sends SIGTERM), say which runs were still going and in which test,
    then exit as the signal would have: the progress lines say only what had finished."""

    def stopped(number: int, frame: Any) -> None:
        lines = selfcheck.still_running() or ["no run was in flight"]
        print("\n".join(["selfcheck: stopped from outside (SIGTERM)", *lines]), file=sys.stderr, flush=True)
        os._exit(128 + number)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stopped)


def _progress_printer(started: float):
    """One stderr line per finished run, as it ends: a matrix stopped at a CI step's limit still says what
    had finished by when (and so, by absence, what was still running). Verdicts are final in the table."""
    lock = threading.Lock()

    def finished(outcome: Any) -> None:
        to_kill = ("" if outcome.seconds_to_first_failure is None
                   else f", {outcome.seconds_to_first_failure:.1f} s to kill")
        with lock:
            print(f"[{time.perf_counter() - started:5.0f} s] {outcome.component} {outcome.spec}: {outcome.verdict} "
                  f"({outcome.seconds:.1f} s{to_kill})", file=sys.stderr, flush=True)

    return finished


def _kill_matrix_changes(root: Path, outcomes: list, *, check: bool, update: bool) -> list[str]:
    """How the killing tests differ from the committed kill matrix (the golden): a line each with ``check`` or
    ``update``, else one line saying how many moved (the golden is not rewritten by a plain run)."""
    from harness.selfcheck import kill_matrix

    golden = selfcheck.KILL_MATRIX_PATH.as_posix()
    moved = kill_matrix.changes(root, outcomes)
    if moved and not (check or update):
        print(f"{len(moved)} killing tests differ from {golden} (--check-kill-matrix lists them; "
              "--update-kill-matrix records them)")
        return moved
    for line in moved:
        print(f"kill matrix changed: {line}")
    if moved and update:
        print(f"recorded in {golden}: review its diff and commit it if intended")
    elif moved:
        print("a suite change moved what kills these mutants: rerun with --update-kill-matrix to record it in "
              f"{golden}, review its diff and commit it if intended")
    return moved


def _report(arguments: argparse.Namespace) -> int:
    """Render a --harness-report JSON, a selfcheck --json and/or a mutate --json as Markdown (for a CI step
    summary)."""
    import json

    from harness.plugin.report import annotations, format_markdown, write_step_summary

    def read(path: str | None):
        if not path:
            return None
        if not Path(path).is_file():  # an earlier step failed before writing it: say so, keep going
            print(f"(no {path}: the step that writes it did not finish)")
            return None
        try:
            return json.loads(Path(path).read_text())
        except ValueError as error:
            raise HarnessError(f"cannot read {path}: {error}") from None

    pins = None
    if arguments.constraints:
        from harness.upstream import read_pins

        if not Path(arguments.constraints).is_file():
            raise HarnessError(f"--constraints {arguments.constraints}: no such file")
        pins = read_pins(arguments.constraints)
    if arguments.run_report or arguments.selfcheck or not arguments.mutation:
        write_step_summary(format_markdown(read(arguments.run_report), read(arguments.selfcheck), pins=pins))
    mutation_run = read(arguments.mutation)
    if mutation_run is not None:
        from harness.mutation.score import format_markdown as mutation_markdown

        write_step_summary(mutation_markdown(mutation_run))
    for junit in arguments.annotate or []:
        for line in annotations(junit):
            print(line)
    return 0


def _conformance(arguments: argparse.Namespace) -> int:
    """Run one component's suite against --impl and report per contract clause; exit 1 on a violation."""
    from harness import conformance

    component, spec = impls.parse_impl_option(arguments.impl)
    _chosen_components(argparse.Namespace(component=[component]))
    report = conformance.run_conformance(component=component, spec=spec, device=arguments.device,
                                         graph_backend=arguments.graph_backend, root=locations.project_root(),
                                         jobs=arguments.jobs, hypothesis_profile=arguments.hypothesis_profile,
                                         time_limit=arguments.time_limit, test_order=arguments.test_order)
    print(conformance.format_text(report))
    markdown, document = conformance.write_report(report, arguments.out)
    print(f"\nwritten: {markdown} and {document}")
    return 0 if report.ok else 1


def _conformance_diff(arguments: argparse.Namespace) -> int:
    """Print what changed between two reports; exit 1 on a change where --expect-identical asks for none."""
    from harness.conformance import diff

    changes = diff.diff_reports(diff.load_report(arguments.old), diff.load_report(arguments.new))
    print(diff.format_diff(changes))
    return 1 if arguments.expect_identical and not changes.identical else 0


def _mutate(arguments: argparse.Namespace) -> int:
    """Mutation-test the references with mutmut; exit 1 on an untriaged survivor or an area below the goal."""
    from harness import mutation

    if not locations.is_checkout():
        raise HarnessError("mutate runs in a checkout: it copies the checkout's harness/, suites/ and golden/ and "
                           "reads the triage files in docs/mutation/")
    root = locations.project_root()
    if arguments.show:
        print(mutation.show_mutant(root, arguments.show))
        return 0
    json_path = Path(arguments.json) if arguments.json else None
    if arguments.rescore:
        return mutation.rescore(root=root, state=root, json_path=json_path)
    return mutation.run_mutation(arguments.area or [], root=root, state=root, jobs=arguments.jobs,
                                 sample=arguments.sample, seed=arguments.seed, json_path=json_path)


def _bench(rest: list[str]) -> int:
    # The bench package owns its command line (shared options, one subcommand per benchmark).
    from harness.bench.command import BENCHMARKS
    from harness.bench.command import main as bench_main

    if rest and not rest[0].startswith("-") and rest[0] not in BENCHMARKS:
        raise HarnessError(f"no benchmark called {rest[0]!r}; available: {', '.join(BENCHMARKS)}")
    return bench_main(rest)


def _invoked_as() -> str:
    """``graph-harness`` from the console script, ``python -m harness`` otherwise, for usage lines."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name and name not in ("__main__.py", "-c") and not name.startswith("python") else "python -m harness"


def _version() -> str:
    """The installed distribution's version; a checkout on ``sys.path`` without an install has the package's."""
    import importlib.metadata

    try:
        return importlib.metadata.version("llm-graph-harness")
    except importlib.metadata.PackageNotFoundError:
        import harness

        return harness.__version__


def _mutation_areas() -> list[str]:
    from harness.mutation.areas import AREAS

    return list(AREAS)


def build_parser(prog: str = "python -m harness") -> argparse.ArgumentParser:
    """The command line of every subcommand but ``bench``, whose options :mod:`harness.bench.command` owns."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Correctness harness for LLM-inference graph optimisations: list what can be "
                               "tested, run the mutant kill matrix, run benchmarks.",
        epilog=f"'{prog} COMMAND --help' describes each command.")
    parser.add_argument("--version", action="version", version=f"llm-graph-harness {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    listing = commands.add_parser("list", help="list the components, their reference, oracle, suite and mutants")
    listing.add_argument("--component", action="append", help="limit to this component (repeatable)")
    check = commands.add_parser("selfcheck", help="run every mutant against its suites; fail if one survives")
    check.add_argument("--component", action="append", help="limit to this component (repeatable)")
    check.add_argument("--graph-backend", choices=BACKEND_CHOICES, default="auto")
    check.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    check.add_argument("--jobs", type=int, default=None,
                       help="pytest processes at once (default: 8 per GPU on a CUDA device, else the CPU cores)")
    check.add_argument("--json", help="also write the kill matrix as JSON here (with seconds to kill per run)")
    check.add_argument("--test-timeout", type=float, default=selfcheck.TEST_SECONDS, metavar="SECONDS",
                       help="time limit of each test in each pytest process; a hang fails the test (0: none; "
                            "default %(default)g)")
    check.add_argument("--process-timeout", type=float, default=selfcheck.PROCESS_SECONDS, metavar="SECONDS",
                       help="time limit of each pytest process, which is then stopped with its workers and reported "
                            "'timed out' (0: none; default %(default)g)")
    check.add_argument("--no-fork-server", action="store_true",
                       help="start every mutant's pytest as a plain process (also HARNESS_FORK_SERVER=0); by default "
                            "they are forked from one process that has imported torch, transformers, hypothesis and "
                            "the harness once (where the platform has os.fork)")
    check.add_argument("--keep-hints", action="store_true",
                       help="do not rewrite this machine's hints cache, .harness_cache/selfcheck-hints.json in the "
                            "checkout, or in the current folder where the harness is installed (each "
                            "mutant's last killing test and seconds to kill, which order the next run's start)")
    check.add_argument("--check-kill-matrix", action="store_true",
                       help="fail when a mutant's killing test differs from golden/selfcheck/kill_matrix.json")
    check.add_argument("--update-kill-matrix", action="store_true",
                       help="record each killed mutant's killing test in golden/selfcheck/kill_matrix.json (a golden: "
                            "review its diff); without it a run only reads that file")
    summary = commands.add_parser("report", help="a run report and/or kill matrix as Markdown ($GITHUB_STEP_SUMMARY)")
    summary.add_argument("--run-report", metavar="PATH", help="JSON written by pytest --harness-report")
    summary.add_argument("--selfcheck", metavar="PATH", help="JSON written by selfcheck --json")
    summary.add_argument("--mutation", metavar="PATH", help="JSON written by mutate --json: the mutation score")
    summary.add_argument("--constraints", metavar="PATH",
                         help="set the run report's upstream versions beside this constraints file's pins (the "
                              "drift job: what moved since the goldens were recorded)")
    summary.add_argument("--annotate", metavar="JUNIT_XML", action="append",
                         help="print a GitHub error annotation for each failed test in this JUnit XML (repeatable)")
    conform = commands.add_parser(
        "conformance", help="run one component's suite against --impl and report which contract clauses hold",
        description="One row per contract clause (harness/conformance/clauses.py): held, violated (with the first "
                    "falsifying example) or not run; core violations (wrong results) first, then strict ones (what the "
                    "harness requires to raise). Writes Markdown and JSON; exits 1 when a clause is violated.")
    conform.add_argument("--impl", required=True, metavar="COMPONENT=SPEC",
                         help="the implementation: reference, mutant:NAME, an engine adapter (sglang, vllm, trtllm, "
                              "bcg, pcg) or pkg.mod:attr")
    conform.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    conform.add_argument("--graph-backend", choices=BACKEND_CHOICES, default="auto")
    conform.add_argument("--jobs", type=int, default=1, help="pytest-xdist workers (default 1: no xdist)")
    conform.add_argument("--hypothesis-profile", default="ci",
                         help="hypothesis profile of the suite's property tests: dev, ci or nightly (default ci: 25 "
                              "derandomized examples, no shrinking, so a failure is reported as found)")
    conform.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                         help="stop the suite after this long and report what finished (the rest: not run)")
    conform.add_argument("--test-order", choices=("collected", "reversed"), default="collected",
                         help="run the tests in collection order or reversed (default collected): each test gets a "
                              "runner of its own, so two recordings in either order must give the same verdicts")
    conform.add_argument("--out", default="conformance",
                         help="folder for the Markdown and JSON (default ./conformance)")
    compare = commands.add_parser(
        "conformance-diff", help="what changed between two conformance reports of one component (their JSON)",
        description="Clause by clause, test by test and finding by finding: newly violated, fixed, tests that newly "
                    "fail or no longer do, new and gone findings. Exits 0, or 1 with --expect-identical where anything "
                    "changed (two recordings of one implementation in other test orders).")
    compare.add_argument("old", help="the earlier report's JSON (conformance-COMPONENT-....json)")
    compare.add_argument("new", help="the later report's JSON")
    compare.add_argument("--expect-identical", action="store_true",
                         help="exit 1 where the reports differ in anything compared")
    mutate = commands.add_parser(
        "mutate", help="mutation-test the references (mutmut) and score the suites against the triage files",
        description="Runs mutmut 3.8.1 (installed on first use into .harness_cache/mutmut-site) over the reference "
                    "modules of each area in a scratch copy (.harness_cache/mutation), classifies every survivor by "
                    "docs/mutation/<area>.json and prints, per area, the counts and the score killed / (mutants - "
                    "equivalent - message-only). Exits 1 when a survivor is untriaged or an area scores below 90%. "
                    "docs/mutation.md says how to triage a survivor.")
    mutate.add_argument("--area", action="append", choices=sorted(_mutation_areas()),
                        help="limit to this area (repeatable; default: every area)")
    mutate.add_argument("--sample", type=int, metavar="N", help="run N mutants per area, picked at random with --seed")
    mutate.add_argument("--seed", type=int, default=0, help="the seed of --sample (default %(default)s)")
    mutate.add_argument("--jobs", type=int, default=2, help="mutants tested at once (default %(default)s)")
    mutate.add_argument("--json", metavar="PATH", help="also write the scores and survivors as JSON here")
    mutate.add_argument("--show", metavar="MUTANT", help="print the diff of a mutant of the last run, and exit")
    mutate.add_argument("--rescore", action="store_true",
                        help="judge the last run again by the triage files as they are now, without running mutmut")
    commands.add_parser("bench", help="benchmarks that print a table and write JSON (bench --help)", add_help=False)
    return parser


def main(argv: list[str] | None = None, *, prog: str | None = None) -> int:
    parser = build_parser(prog or _invoked_as())
    arguments, rest = parser.parse_known_args(argv)
    if arguments.command != "bench" and rest:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    try:
        if arguments.command == "list":
            return _list(arguments)
        if arguments.command == "selfcheck":
            return _selfcheck(arguments)
        if arguments.command == "report":
            return _report(arguments)
        if arguments.command == "conformance":
            return _conformance(arguments)
        if arguments.command == "conformance-diff":
            return _conformance_diff(arguments)
        if arguments.command == "mutate":
            return _mutate(arguments)
        return _bench(rest)
    except HarnessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
