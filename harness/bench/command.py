"""``python -m harness bench BENCHMARK``: the one command skeleton every benchmark runs in.

:data:`BENCHMARKS` names the benchmark modules; the module interface a benchmark provides, the shared
options and the exit statuses are in the README's Benchmarks section."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import impls, locations
from harness.bench import baseline as baselines
from harness.bench.report import (
    DEFAULT_GATE_VERSION,
    Result,
    check_plot_extra,
    environment,
    format_header,
    make_report,
    read_json,
    write_json,
)
from harness.bench.timing import spin_up
from harness.devices import BACKEND_CHOICES, DEVICE_CHOICES, resolve, use_one_compile_worker
from harness.errors import HarnessError, UsageError
from harness.graphs import backend_for

__all__ = ["BENCHMARKS", "build_parser", "main"]

BENCHMARKS = {
    "runner": "harness.bench.runner",  # replay vs eager: launches, times and their split, captures
    "gather": "harness.bench.gather",  # eager, compiled and candidate gathers: plain calls and in a graph
    "tolerance": "harness.bench.tolerance",  # replay-vs-eager differences against the tolerance table
}


def _shared_options() -> argparse.ArgumentParser:
    shared = argparse.ArgumentParser(add_help=False)
    group = shared.add_argument_group("options of every benchmark")
    group.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    group.add_argument("--graph-backend", choices=BACKEND_CHOICES, default="auto",
                       help="auto: cuda on a CUDA device, else emulated (counts only, no times)")
    group.add_argument("--impl", action="append", default=[], metavar="COMPONENT=SPEC",
                       help="the implementation to measure: reference, mutant:NAME or package.module:attribute")
    group.add_argument("--json", metavar="PATH", help="write the report (environment, settings, rows, figures) here")
    group.add_argument("--repeat", type=int, default=None,
                       help="timed samples per figure (CUDA; default 30); median and spread are reported")
    group.add_argument("--baseline", metavar="PATH",
                       help="compare with this report of the same device class, a file or the name of a committed "
                            "baseline (emulated-gather, h200-runner, ...); exit 1 on a regression")
    group.add_argument("--record-baseline", metavar="PATH",
                       help="write this run's report as a baseline of the implementation under test (the file "
                            "--json writes), for later runs' --baseline PATH; not with --baseline")
    group.add_argument("--time-floor", type=float, default=baselines.Thresholds.floor,
                       help="smallest relative change of a reported (not gated) time or speed-up shown as slower or "
                            "faster (default %(default)s; reported, never failed)")
    group.add_argument("--noise-factor", type=float, default=baselines.Thresholds.noise_factor,
                       help="...and how many spreads of the noisier run it must exceed (default %(default)s)")
    group.add_argument("--gate-floor", type=float, default=baselines.Thresholds.gate_floor,
                       help="smallest worsening of a gated time (alone or a group's geometric mean) that fails "
                            "(default %(default)s; counts fail on any change)")
    group.add_argument("--gate-cap", type=float, default=baselines.Thresholds.gate_cap,
                       help="largest band of a gated time however noisy the runs (default %(default)s): noise "
                            "beyond it is settled by re-measuring")
    group.add_argument("--confirm", type=int, default=2, metavar="N",
                       help="re-measure a gated time beyond its band up to N times; it fails only if every "
                            "re-measurement is beyond its band too (default %(default)s; 0: fail at once)")
    group.add_argument("--plot", metavar="PNG",
                       help="also plot the speed-ups (needs matplotlib: pip install 'llm-graph-harness[plot]')")
    return shared


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness bench",
                                     description="benchmarks that print a table and write JSON; "
                                                 "'python -m harness bench NAME --help' lists the options of one")
    commands = parser.add_subparsers(dest="benchmark", required=True, metavar="{" + ",".join(BENCHMARKS) + "}")
    shared = _shared_options()
    for name, module_name in BENCHMARKS.items():
        module = importlib.import_module(module_name)
        # Help text is shown in a terminal: the docstrings' reStructuredText backquotes stay out of it.
        sub = commands.add_parser(name, parents=[shared], help=module.DESCRIPTION.replace("``", ""),
                                  description=module.__doc__.replace("``", ""),
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_options(sub.add_argument_group(f"options of bench {name}"))
    return parser


def _implementations(options: list[str], components: Sequence[str]) -> dict[str, Any]:
    """The one implementation to measure, as {spec: Implementation}; the reference when none is named."""
    chosen: dict[str, str] = {}
    for option in options:
        component, spec = impls.parse_impl_option(option)
        if component not in components:
            raise UsageError(f"--impl {option!r}: this benchmark measures {' or '.join(components)}, not {component}")
        if component in chosen:
            raise UsageError(f"--impl names {component} twice ({chosen[component]!r} and {spec!r}); give one")
        chosen[component] = spec
    component = components[0]
    spec = chosen.get(component, "reference")
    return {spec: impls.load(component, spec)}


def _matching_command(options: argparse.Namespace, baseline: dict[str, Any], *, path: str | None = None,
                      record: bool = False) -> str | None:
    """The bench command line that measures what ``baseline`` holds (its benchmark, device class and
    settings), with this run's implementation, gated on ``path`` (default: this run's ``--baseline``);
    with ``record``, the one that records it again: its own implementation and number of repeats, written
    to ``path``. None for a baseline this version cannot read back."""
    name = baseline.get("benchmark")
    try:
        module = importlib.import_module(BENCHMARKS[name])
        where, _, backend = baseline["environment"]["device_class"].rpartition("/")
        arguments = module.arguments_for(baseline["settings"])
    except (KeyError, TypeError, AttributeError):
        return None
    if record:
        spec = baseline.get("implementation", "reference")
        impl = [] if spec == "reference" else ["--impl", f"{module.COMPONENTS[0]}={spec}"]
        repeats = _recorded_repeats(baseline)
        impl += ["--repeat", str(repeats)] if repeats else []
    else:
        impl = [word for spec in options.impl if spec.partition("=")[0] in module.COMPONENTS
                for word in ("--impl", spec)]
    words = ["python", "-m", "harness", "bench", name, "--device", "cuda" if where.startswith("cuda") else "cpu",
             "--graph-backend", backend, *arguments, *impl, "--record-baseline" if record else "--baseline",
             path or options.baseline]
    gpu = where.removeprefix("cuda:") if where.startswith("cuda:") else None
    return shlex.join(words) + (f" (on an {gpu})" if gpu else "")


def _recorded_repeats(report: dict[str, Any]) -> int | None:
    """The --repeat a report was measured with: the samples of its first timed row figure (None for counts only)."""
    for row in report.get("rows", ()):
        for value in row.values():
            if isinstance(value, dict) and "repeats" in value and "median" in value:
                return int(value["repeats"])
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one benchmark; returns the exit status (usage errors are printed as one line, status 2)."""
    parser = build_parser()
    options = parser.parse_args(argv)
    try:
        return _run(options)
    except HarnessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _run(options: argparse.Namespace) -> int:
    module = importlib.import_module(BENCHMARKS[options.benchmark])
    if options.repeat is not None and options.repeat < 1:
        raise UsageError(f"--repeat {options.repeat}: need at least one sample")
    if options.record_baseline is not None:
        if options.baseline is not None:
            raise UsageError(f"--record-baseline {options.record_baseline} with --baseline {options.baseline}: "
                             "record a baseline in one run, gate on it with --baseline in later runs")
        locations.check_writable_file("--record-baseline", options.record_baseline, start=Path.cwd())
    placement = resolve(device=options.device, graph_backend=options.graph_backend)
    device, backend_name = placement.device, placement.graph_backend
    use_one_compile_worker(os.environ)  # the benchmarks time replays and count compiles; a pool only slows start-up
    backend = backend_for(placement)
    requested = module.settings_of(options, device=device)
    env = environment(device, backend_name)
    gate_version = getattr(module, "GATE_VERSION", DEFAULT_GATE_VERSION)
    if options.confirm < 0:
        raise UsageError(f"--confirm {options.confirm}: the number of re-measurements is 0 or more")
    baseline = None
    if options.baseline:
        # A bad file, another benchmark, device class, gate version or settings: refused before measuring.
        baseline_path = locations.resolve_baseline(options.baseline)
        baseline = read_json(baseline_path)
        baselines.check_comparable({"benchmark": options.benchmark, "environment": env, "settings": requested,
                                    "gate_version": gate_version},
                                   baseline, rerun=_matching_command(options, baseline),
                                   rerecord=_matching_command(options, baseline, path=_shown(baseline_path),
                                                              record=True))
    implementations = _implementations(options.impl, module.COMPONENTS)
    if options.plot:
        if not hasattr(module, "plot"):
            raise UsageError(f"bench {options.benchmark} has no plot")
        check_plot_extra()
    thresholds = baselines.Thresholds(floor=options.time_floor, noise_factor=options.noise_factor,
                                      gate_floor=options.gate_floor, gate_cap=options.gate_cap)
    spin_up(device)
    result = module.run(options, device=device, backend=backend, implementations=implementations,
                        repeat=options.repeat or 30)
    (spec,) = implementations
    print(format_header(f"bench {options.benchmark} ({spec})", env, result.settings))
    print(module.format_table(result, device=device))
    report = make_report(benchmark=options.benchmark, env=env, result=result, implementation=spec,
                         gate_version=gate_version)
    noise = report["noise"]
    if noise["timed_figures"]:
        print(f"noise: {noise['timed_figures']} timed figures, median spread {noise['median_spread'] * 100:.1f}%, "
              f"largest {noise['max_spread'] * 100:.1f}%; against a baseline, a gated time fails beyond "
              f"min({thresholds.gate_cap * 100:.0f}%, max({thresholds.gate_floor * 100:.0f}%, "
              f"{thresholds.gate_z:g} standard errors)) when re-measuring confirms it, other times and speed-ups "
              f"are reported beyond max({thresholds.floor * 100:.0f}%, {thresholds.noise_factor:g} x spread)")
    if options.json:
        write_json(report, options.json)
        print(f"wrote {options.json}")
    if options.record_baseline:
        try:
            Path(options.record_baseline).absolute().parent.mkdir(parents=True, exist_ok=True)
            write_json(report, options.record_baseline)
        except OSError as error:  # checked before measuring; a read-only file system, a full disk
            raise UsageError(f"--record-baseline {options.record_baseline}: {error}") from None
        gate = _matching_command(options, report, path=options.record_baseline)
        print(f"recorded the baseline of {spec} in {options.record_baseline}; commit it, then gate later runs with: "
              f"{gate}")
    if options.plot:
        module.plot(result, options.plot)
        print(f"wrote {options.plot}")
    status = 1 if getattr(module, "failed", lambda result: False)(result) else 0
    if baseline is not None:
        findings = baselines.compare(report, baseline, thresholds=thresholds)
        findings = _confirmed(findings, baseline, result, options.confirm, thresholds)
        print(baselines.format_findings(findings, baseline_path=options.baseline, thresholds=thresholds))
        if baselines.failed(findings):
            status = 1
    return status


def _confirmed(findings: list[baselines.Finding], baseline: dict[str, Any], result: Result, attempts: int,
               thresholds: baselines.Thresholds) -> list[baselines.Finding]:
    """``findings`` with every suspected regression re-measured (:func:`harness.bench.baseline.confirm`), saying
    what is re-measured; a run that fails on counts or missing figures is not: re-measuring cannot change that."""
    suspected = baselines.suspects(findings)
    if not suspected or attempts == 0:
        return findings
    exact = baselines.exact_failures(findings)
    if exact:
        print(f"not re-measuring {len(suspected)} gated time(s) beyond their bands: {len(exact)} finding(s) fail "
              "exactly (counts or missing figures), which re-measuring cannot change")
        return findings
    if result.remeasure is None:
        print(f"bench cannot re-measure; {len(suspected)} gated time(s) beyond their bands fail as first measured")
        return findings
    remeasure = result.remeasure
    print(f"re-measuring {len(suspected)} gated time(s) beyond their bands, up to {attempts} time(s): "
          + ", ".join(f.key for f in suspected))

    def fresh(keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        return {key: dataclasses.asdict(figure) for key, figure in remeasure(keys).items()}

    return baselines.confirm(findings, baseline, fresh, thresholds=thresholds, attempts=attempts)


def _shown(path: Path) -> str:
    """``path`` relative to the current folder where it lies under it (as a checkout's committed baselines do)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
