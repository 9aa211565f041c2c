"""``python -m harness bench gather``: what the compiled gather saves, measured on this torch.

For the eager oracle, the compiled reference and every ``--impl gather=SPEC``, at index counts
1, 8, 64, 256 and 1024, with and without hidden states: kernel launches per call (profiler device
kernels on CUDA; on the CPU, where inductor's kernels are invisible, top-level ATen ops), time per
call (CUDA events on the GPU, wall clock on the CPU), the first-call (compile) time and the number
of graphs dynamo compiled. Prints a table and writes the same numbers as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from typing import Any, Callable, Optional

import torch

from harness import impls
from harness.devices import resolve_device
from harness.errors import UsageError
from harness.gather.accounting import compile_accounting, count_launches
from harness.gather.cases import BufferSpec, GatherCase

__all__ = ["Measurement", "measure", "main"]

_BASELINE = "eager"


@dataclasses.dataclass
class Measurement:
    implementation: str
    with_hidden: bool
    count: int
    kernels_per_call: Optional[float]
    aten_ops_per_call: float
    us_per_call: float
    wall_us_per_call: float
    first_call_ms: float


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_per_call(fn: Callable[[], Any], device: torch.device, repeats: int) -> tuple[float, float]:
    """(device-timeline µs, wall-clock µs) per call, averaged over ``repeats`` back-to-back calls."""
    _synchronize(device)
    wall_start = time.perf_counter()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        wall = (time.perf_counter() - wall_start) * 1e6 / repeats
        return start.elapsed_time(end) * 1e3 / repeats, wall
    for _ in range(repeats):
        fn()
    wall = (time.perf_counter() - wall_start) * 1e6 / repeats
    return wall, wall


def measure(name: str, gather: Callable[..., Any], *, device: torch.device, counts: list[int], pool: int,
            topk: int, hidden_size: int, hidden_dtype: torch.dtype, repeats: int,
            seed: int = 0) -> tuple[list[Measurement], dict[str, Any]]:
    """Measure one implementation from a clean dynamo state; returns rows and compile totals."""
    torch._dynamo.reset()  # each implementation pays its own compiles
    rows: list[Measurement] = []
    hidden = BufferSpec((hidden_size,), hidden_dtype)
    compile_started = time.perf_counter()
    with compile_accounting(fail_on_recompile_limit=False) as tally:
        for with_hidden in (True, False):
            case = GatherCase(pool=pool, count=0, seed=seed, topk_p=BufferSpec((topk,), torch.float32),
                              topk_index=BufferSpec((topk,), torch.int64), hidden=hidden if with_hidden else None)
            buffers = case.build(device).buffers
            generator = torch.Generator().manual_seed(seed)
            for count in counts:
                indices = torch.randint(0, pool, (count,), generator=generator).to(device)
                call = lambda: gather(indices, *buffers)  # noqa: E731
                _synchronize(device)
                first = time.perf_counter()
                call()
                _synchronize(device)
                first_ms = (time.perf_counter() - first) * 1e3
                for _ in range(3):
                    call()
                launches = count_launches(call, device=device)
                device_us, wall_us = _time_per_call(call, device, repeats)
                rows.append(Measurement(name, with_hidden, count, launches.kernels, launches.aten_ops,
                                        device_us, wall_us, first_ms))
    totals = {"graphs": tally.graphs, "failed_frames": tally.failed_frames, "graph_breaks": tally.graph_breaks,
              "first_calls_s": sum(r.first_call_ms for r in rows) / 1e3,
              "sweep_s": time.perf_counter() - compile_started}
    return rows, totals


def _parse_impl(option: str) -> str:
    component, sep, spec = option.partition("=")
    if not sep:
        return option  # a bare SPEC is taken as gather=SPEC
    if component.strip() != "gather":
        raise UsageError(f"--impl {option!r}: the gather benchmark only takes gather=SPEC")
    return impls.parse_impl_option(option)[1]


def _format_table(rows: list[Measurement], device: torch.device) -> str:
    baseline = {(r.with_hidden, r.count): r for r in rows if r.implementation == _BASELINE}
    launch_label = "kernels/call" if device.type == "cuda" else "aten ops/call"
    time_label = "GPU us/call" if device.type == "cuda" else "us/call"
    header = f"{'implementation':<28} {'hidden':<6} {'count':>6} {launch_label:>13} {'saved':>6} {time_label:>11} {'wall us':>9} {'vs eager':>8}"
    lines = [header, "-" * len(header)]
    for row in rows:
        base = baseline.get((row.with_hidden, row.count))
        launches = row.kernels_per_call if row.kernels_per_call is not None else row.aten_ops_per_call
        base_launches = None if base is None else (
            base.kernels_per_call if base.kernels_per_call is not None else base.aten_ops_per_call)
        saved = "" if base_launches is None else f"{base_launches - launches:g}"
        ratio = "" if base is None or row.us_per_call == 0 else f"{base.us_per_call / row.us_per_call:.2f}x"
        lines.append(f"{row.implementation:<28} {'yes' if row.with_hidden else 'no':<6} {row.count:>6} "
                     f"{launches:>13g} {saved:>6} {row.us_per_call:>11.1f} {row.wall_us_per_call:>9.1f} {ratio:>8}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run the benchmark; ``argv`` are the options after ``bench gather``."""
    parser = argparse.ArgumentParser(prog="python -m harness bench gather", description=__doc__.splitlines()[0])
    parser.add_argument("--impl", action="append", default=[], metavar="gather=SPEC",
                        help="also measure this implementation (registered name or package.module:function)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--json", default="gather-bench.json", metavar="PATH", help="where to write the results")
    parser.add_argument("--counts", default="1,8,64,256,1024", help="index counts, comma-separated")
    parser.add_argument("--pool", type=int, default=4096, help="slots per buffer")
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--hidden-size", type=int, default=4096)
    parser.add_argument("--hidden-dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per point (default 200 on CUDA, 20 on CPU)")
    options = parser.parse_args(argv)
    device = resolve_device(options.device)
    try:
        counts = [int(c) for c in options.counts.split(",") if c.strip()]
    except ValueError:
        raise UsageError(f"--counts {options.counts!r}: expected comma-separated integers such as 1,8,64") from None
    if any(c < 0 for c in counts) or options.pool < 1:
        raise UsageError(f"--counts must be >= 0 and --pool >= 1; got counts {counts}, pool {options.pool}")
    repeats = options.repeats or (200 if device.type == "cuda" else 20)
    chosen = {_BASELINE: impls.load("gather", _BASELINE), "reference": impls.load("gather", "reference")}
    for option in options.impl:
        spec = _parse_impl(option)
        chosen[spec] = impls.load("gather", spec)
    rows: list[Measurement] = []
    totals: dict[str, Any] = {}
    for name, implementation in chosen.items():
        measured, totals[name] = measure(
            name, implementation.obj, device=device, counts=counts, pool=options.pool, topk=options.topk,
            hidden_size=options.hidden_size, hidden_dtype=getattr(torch, options.hidden_dtype), repeats=repeats)
        rows.extend(measured)
    print(f"gather benchmark: torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else f" ({platform.processor() or platform.machine()})")
          + f", pool {options.pool}, topk {options.topk}, hidden {options.hidden_size} {options.hidden_dtype}, "
          f"{repeats} calls per point")
    if device.type != "cuda":
        print("on the CPU inductor's kernels are invisible to the profiler: 'aten ops/call' counts eager ATen "
              "ops only (a compiled call shows 0); kernel launches are measured on CUDA")
    print(_format_table(rows, device))
    print()
    for name, total in totals.items():
        print(f"{name}: {total['graphs']} graphs compiled, first calls {total['first_calls_s']:.2f} s "
              f"(compile included), {total['failed_frames']} frames fell back to eager, "
              f"{total['graph_breaks']} graph breaks")
    report = {
        "torch": torch.__version__, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine(),
        "settings": {"counts": counts, "pool": options.pool, "topk": options.topk,
                     "hidden_size": options.hidden_size, "hidden_dtype": options.hidden_dtype, "repeats": repeats},
        "launch_unit": "device kernels per call" if device.type == "cuda" else "top-level ATen ops per call",
        "rows": [dataclasses.asdict(row) for row in rows],
        "compile": totals,
    }
    with open(options.json, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2)
    print(f"wrote {options.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
