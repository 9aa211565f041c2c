"""``python -m harness`` (also ``graph-harness``): selfcheck and benchmarks.

    python -m harness selfcheck [--component C ...] [--graph-backend B] [--device D] [--jobs N] [--json PATH]
    python -m harness bench runner|gather|tolerance [options; --help lists each benchmark's own]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness import impls
from harness.devices import DEVICE_CHOICES
from harness.errors import HarnessError
from harness.graphs import BACKEND_NAMES

__all__ = ["main"]

def _project_root() -> Path:
    """The checkout holding ``suites/``: the current directory or the one above the package."""
    for candidate in (Path.cwd(), Path(__file__).resolve().parent.parent):
        if (candidate / "suites").is_dir():
            return candidate
    raise HarnessError("cannot find the suites/ folder: run this from the root of a harness checkout")


def _selfcheck(arguments: argparse.Namespace) -> int:
    from harness import selfcheck

    available = list(impls.components())
    chosen = arguments.component or available
    unknown = [c for c in chosen if c not in available]
    if unknown:
        raise HarnessError(f"unknown component(s) {', '.join(unknown)}; known: {', '.join(available)}")
    root = _project_root()
    started = time.perf_counter()
    outcomes = selfcheck.run_selfcheck(components=chosen, graph_backend=arguments.graph_backend,
                                       device=arguments.device, jobs=arguments.jobs, root=root)
    wall = time.perf_counter() - started
    print(selfcheck.format_matrix(outcomes))
    print(f"whole matrix: {wall:.0f} s")
    if arguments.json:
        selfcheck.write_json(outcomes, arguments.json, wall_seconds=round(wall, 1))
    if not arguments.keep_hints:
        selfcheck.write_hints(root, outcomes)
    return 0 if all(o.ok for o in outcomes) else 1


def _bench(rest: list[str]) -> int:
    # The bench package owns its command line (shared options, one subcommand per benchmark).
    from harness.bench.command import BENCHMARKS, main as bench_main

    if rest and not rest[0].startswith("-") and rest[0] not in BENCHMARKS:
        raise HarnessError(f"no benchmark called {rest[0]!r}; available: {', '.join(BENCHMARKS)}")
    return bench_main(rest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("selfcheck", help="run every mutant against its suites; fail if one survives")
    check.add_argument("--component", action="append", help="limit to this component (repeatable)")
    check.add_argument("--graph-backend", choices=BACKEND_NAMES, default="auto")
    check.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    check.add_argument("--jobs", type=int, default=None,
                       help="pytest processes at once (default: 4 per GPU on a CUDA device, else the CPU cores)")
    check.add_argument("--json", help="also write the kill matrix as JSON here (with seconds to kill per run)")
    check.add_argument("--keep-hints", action="store_true",
                       help="do not rewrite golden/selfcheck/kill_matrix.json (which test killed each mutant)")
    commands.add_parser("bench", help="benchmarks that print a table and write JSON (bench --help)", add_help=False)
    arguments, rest = parser.parse_known_args(argv)
    if arguments.command == "selfcheck" and rest:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    try:
        if arguments.command == "selfcheck":
            return _selfcheck(arguments)
        return _bench(rest)
    except HarnessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
