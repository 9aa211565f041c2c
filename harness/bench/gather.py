"""``python -m harness bench gather``: what the compiled gather saves, as plain calls and inside a graph.

Measures eager, the compiled reference and the candidate (``--impl gather=SPEC``); the candidate's
figures are what a baseline holds. ``docs/gather.md`` (The benchmark) describes the table."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

from harness import impls
from harness.bench.report import Figure, Result, Stat, format_stat, plot_speedups
from harness.bench.timing import synchronize, time_call
from harness.errors import ImplementationError, UsageError
from harness.gather.accounting import compile_accounting, count_launches
from harness.gather.cases import BufferSpec, GatherCase
from harness.graphs import GraphCapturer
from harness.impls import describe_exception

__all__ = ["COMPONENTS", "add_options", "settings_of", "arguments_for", "run", "format_table", "plot"]

COMPONENTS = ("gather",)
DESCRIPTION = __doc__.splitlines()[0]
_DTYPES = ("bfloat16", "float16", "float32")


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--counts", default="1,8,64,1024", help="index counts, comma-separated (default %(default)s)")
    parser.add_argument("--pool", type=int, default=4096, help="slots per buffer")
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--hidden-size", type=int, default=4096)
    parser.add_argument("--hidden-dtype", default="bfloat16", choices=_DTYPES)
    parser.add_argument("--calls", type=int, default=50,
                        help="back-to-back calls (or replays) per timed sample (CUDA; default 50)")


def settings_of(options: argparse.Namespace, *, device: torch.device) -> dict[str, Any]:
    """What a run with ``options`` measures, as its report records it."""
    try:
        counts = [int(c) for c in options.counts.split(",") if c.strip()]
    except ValueError:
        raise UsageError(f"--counts {options.counts!r}: expected comma-separated integers such as 1,8,64") from None
    if not counts or any(c < 0 for c in counts) or options.pool < 1 or options.calls < 1:
        raise UsageError(f"--counts must be >= 0, --pool and --calls >= 1; got counts {counts}, pool {options.pool}, "
                         f"calls {options.calls}")
    return {"counts": counts, "pool": options.pool, "topk": options.topk, "hidden_size": options.hidden_size,
            "hidden_dtype": options.hidden_dtype, "calls": options.calls}


def arguments_for(recorded: dict[str, Any]) -> list[str]:
    """The options of a run that measures what ``recorded`` (a report's settings) holds."""
    return ["--counts", ",".join(map(str, recorded["counts"])), "--pool", str(recorded["pool"]),
            "--topk", str(recorded["topk"]), "--hidden-size", str(recorded["hidden_size"]),
            "--hidden-dtype", recorded["hidden_dtype"], "--calls", str(recorded["calls"])]


def _launches(fn: Callable[[], Any], device: torch.device) -> float:
    counted = count_launches(fn, device=device)
    return counted.kernels if counted.kernels is not None else counted.aten_ops


def _measure(role: str, gather: Callable[..., Any], *, device: torch.device, backend: Any,
             settings: dict[str, Any], repeat: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One implementation from a clean dynamo state: rows per (hidden, count), and compile totals."""
    torch._dynamo.reset()  # each implementation pays its own compiles
    on_cuda = device.type == "cuda"
    capturer = GraphCapturer(backend)
    hidden_spec = BufferSpec((settings["hidden_size"],), getattr(torch, settings["hidden_dtype"]))
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    with compile_accounting(fail_on_recompile_limit=False) as tally:
        for with_hidden in (True, False):
            case = GatherCase(pool=settings["pool"], count=0, seed=0,
                              topk_p=BufferSpec((settings["topk"],), torch.float32),
                              topk_index=BufferSpec((settings["topk"],), torch.int64),
                              hidden=hidden_spec if with_hidden else None)
            buffers = case.build(device).buffers
            generator = torch.Generator().manual_seed(0)
            # The neighbour: a decode step's projection, the same for every count and implementation.
            activation = torch.randn(64, settings["hidden_size"], generator=generator).to(device, hidden_spec.dtype)
            weight = torch.randn(settings["hidden_size"], 256, generator=generator).to(device, hidden_spec.dtype)
            projected = torch.empty(64, 256, device=device, dtype=hidden_spec.dtype)

            def neighbour(activation: torch.Tensor = activation, weight: torch.Tensor = weight,
                          projected: torch.Tensor = projected) -> None:
                torch.mm(activation, weight, out=projected)

            neighbour_graph = capturer.capture(neighbour)
            for count in settings["counts"]:
                indices = torch.randint(0, settings["pool"], (count,), generator=generator).to(device)

                def call(indices: torch.Tensor = indices, buffers: Any = buffers) -> Any:
                    return gather(indices, *buffers)

                def step(call: Callable[[], Any] = call) -> Any:
                    neighbour()
                    return call()

                synchronize(device)
                first = time.perf_counter()
                try:
                    call()
                except Exception as error:  # noqa: BLE001 - the implementation's own failure, said in one line
                    raise ImplementationError(
                        f"bench gather: the {role} implementation raised on its first call (index count {count}, "
                        f"with_hidden={with_hidden}): {describe_exception(error)}") from None
                synchronize(device)
                row: dict[str, Any] = {"implementation": role, "hidden": with_hidden, "count": count,
                                       "first_call_ms": (time.perf_counter() - first) * 1e3 if on_cuda else None}
                for _ in range(3):
                    call()
                graph = capturer.capture(step)
                row["launches"] = _launches(call, device)
                row["graph_launches"] = _launches(graph.replay, device) - _launches(neighbour_graph.replay, device)
                if on_cuda:
                    plain = time_call(call, device=device, repeat=repeat, inner=settings["calls"])
                    in_graph = time_call(graph.replay, device=device, repeat=repeat, inner=settings["calls"])
                    alone = time_call(neighbour_graph.replay, device=device, repeat=repeat, inner=settings["calls"])
                    row["plain_us"] = _micro(plain.gpu)
                    row["plain_wall_us"] = _micro(plain.wall)
                    row["graph_us"] = _difference(_micro(in_graph.gpu), _micro(alone.gpu))
                rows.append(row)
                del graph
    totals = {"graphs": tally.graphs, "failed_frames": tally.failed_frames, "graph_breaks": tally.graph_breaks,
              "first_calls_s": sum(r["first_call_ms"] for r in rows) / 1e3 if on_cuda else None,
              "sweep_s": time.perf_counter() - started if on_cuda else None}  # emulation: counts only
    return rows, totals


def _micro(stat: Stat) -> Stat:
    return Stat(stat.median * 1e3, stat.spread, stat.repeats, None if stat.low is None else stat.low * 1e3)


def _difference(total: Stat, part: Stat) -> Stat:
    """``total - part``, its spread relative to the (smaller) difference: absolute spreads add in quadrature."""
    value = max(total.median - part.median, 0.0)
    absolute = ((total.median * total.spread) ** 2 + (part.median * part.spread) ** 2) ** 0.5
    return Stat(value, absolute / value if value else 0.0, min(total.repeats, part.repeats))


def run(options: argparse.Namespace, *, device: torch.device, backend: Any, implementations: dict[str, Any],
        repeat: int) -> Result:
    """Measure eager, the reference and the candidate; compile totals per implementation go to ``extra``."""
    settings = settings_of(options, device=device)
    (spec, candidate), = implementations.items()
    chosen = {"eager": impls.load("gather", "eager").obj, "reference": impls.load("gather", "reference").obj}
    if spec not in chosen:
        chosen["candidate"] = candidate.obj
    rows: list[dict[str, Any]] = []
    totals: dict[str, Any] = {}
    # The candidate is measured first, so that its failure ends the run before the others' compiles; the
    # rows keep the order eager, reference, candidate.
    for role in sorted(chosen, key=lambda role: role != "candidate"):
        measured, totals[role] = _measure(role, chosen[role], device=device, backend=backend, settings=settings,
                                          repeat=repeat)
        rows.extend(measured)
    order = list(chosen)
    rows.sort(key=lambda row: order.index(row["implementation"]))
    totals = {role: totals[role] for role in order}
    if spec in chosen:  # the candidate is eager or the reference itself: its figures are theirs
        rows.extend({**row, "implementation": "candidate"} for row in list(rows) if row["implementation"] == spec)
        totals["candidate"] = totals[spec]
    eager = {(r["hidden"], r["count"]): r for r in rows if r["implementation"] == "eager"}
    figures: dict[str, Figure] = {}
    for row in rows:
        base = eager[(row["hidden"], row["count"])]
        for field in ("plain_us", "graph_us"):
            if isinstance(row.get(field), Stat) and row[field].median > 0:
                row[field.replace("_us", "_vs_eager")] = row[field].ratio_to(base[field])
        if row["implementation"] != "candidate":
            continue
        key = f"candidate/{'hidden' if row['hidden'] else 'no-hidden'}/{row['count']}"
        figures[f"{key}/launches"] = Figure.count(row["launches"])
        figures[f"{key}/graph_launches"] = Figure.count(row["graph_launches"])
        if device.type == "cuda":
            figures[f"{key}/plain_us"] = Figure.time(row["plain_us"], "us")
            figures[f"{key}/graph_us"] = Figure.time(row["graph_us"], "us")
    figures["candidate/compiled_graphs"] = Figure.count(totals["candidate"]["graphs"])
    figures["candidate/failed_frames"] = Figure.count(totals["candidate"]["failed_frames"])
    return Result(settings, rows, figures, {"compile": totals})


def format_table(result: Result, *, device: torch.device) -> str:
    rows, totals = result.rows, result.extra["compile"]
    on_cuda = device.type == "cuda"
    unit = "kernels" if on_cuda else "ATen ops"
    header = f"{'implementation':<14} {'hidden':<6} {'count':>6} {unit + '/call':>14} {'in graph':>9}"
    if on_cuda:
        header += f" {'GPU us/call':>14} {'wall us':>14} {'vs eager':>12} {'in-graph us':>14} {'vs eager':>12}"
    lines = [header, "-" * len(header)]
    for row in rows:
        line = (f"{row['implementation']:<14} {'yes' if row['hidden'] else 'no':<6} {row['count']:>6} "
                f"{row['launches']:>14g} {row['graph_launches']:>9g}")
        if on_cuda:
            line += (f" {format_stat(row['plain_us'], digits=1):>14} {format_stat(row['plain_wall_us'], digits=1):>14}"
                     f" {format_stat(row.get('plain_vs_eager'), unit='x'):>12}"
                     f" {format_stat(row['graph_us'], digits=1):>14} "
                     f"{format_stat(row.get('graph_vs_eager'), unit='x'):>12}")
        lines.append(line)
    lines.append("")
    lines += [f"{role}: {t['graphs']} graphs compiled, "
              + (f"first calls {t['first_calls_s']:.2f} s (compile included), "
                 if t["first_calls_s"] is not None else "")
              + f"{t['failed_frames']} frames fell back to eager, {t['graph_breaks']} graph breaks"
              for role, t in totals.items()]
    lines.append("'in graph': launches of one replay of [neighbour matmul + gather] minus the neighbour's alone"
                 + ("; 'vs eager' > 1 is faster than eager" if on_cuda else ""))
    if not on_cuda:
        lines.append("on the CPU inductor's kernels are invisible to the profiler: a compiled call shows 0 ATen ops; "
                     "inside an emulated capture compiled code runs eagerly, so 'in graph' counts the eager ops")
    return "\n".join(lines)


def plot(result: Result, path: str) -> None:
    rows = result.rows
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        for where in ("plain", "graph"):
            ratio = row.get(f"{where}_vs_eager")
            if isinstance(ratio, Stat) and row["count"] > 0 and row["implementation"] != "eager":
                label = f"{row['implementation']}, {where}, {'hidden' if row['hidden'] else 'no hidden'}"
                series.setdefault(label, []).append((row["count"], ratio.median))
    plot_speedups(path, title="gather: speed-up over eager", xlabel="index count", series=series)
