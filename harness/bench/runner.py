"""``python -m harness bench runner``: what replaying the layer stack buys over eager, and where it goes.

For each zoo model and size and each batch composition: launches, fallbacks, times and the replay's
split (segments, breaks, eager glue, the runner's host overhead), per-bucket capture figures, then the
per-layer divergence table. The README's Benchmarks section describes the table and what a baseline gates."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from harness.bench.report import Figure, Result, Stat, format_stat, plot_speedups
from harness.bench.timing import synchronize, time_call
from harness.errors import UsageError
from harness.gather.accounting import count_launches
from harness.graphs import BreakableGraph, GraphCapturer
from harness.graphs._breakable import Break
from harness.models import build_model
from harness.models.engine import ModelConfig
from harness.runner import ForwardBatch, discover_layer_model
from harness.runner.divergence import (
    DIVERGENCE_ARCHITECTURES,
    LayerDivergence,
    architecture_divergence,
    format_divergence_table,
)

__all__ = ["COMPONENTS", "GATE_VERSION", "HOST_SAMPLES", "SIZES", "FULL", "QUICK", "add_options", "settings_of",
           "arguments_for", "run", "figures_of", "format_table", "plot", "shared_models"]

COMPONENTS = ("runner",)
DESCRIPTION = __doc__.splitlines()[0]
# What a baseline gates (harness.bench.baseline): version 1 gated each model's mean speed-up; version 2
# gates the captured segments' GPU time and each model's runner host overhead relative to a host reference,
# which a version-1 baseline does not hold.
GATE_VERSION = 2
# Samples of the replay's split (segments, breaks, host overhead), whatever --repeat: the gated host figure
# is a median, whose standard error is about a sixth of the samples' spread with this many, small enough
# beside the gate's floor for a 20% slower host path to stand out in one measurement.
HOST_SAMPLES = 40
# GPU work queued before each captured segment while its time is measured, in GPU clock cycles (about
# 0.2 ms at the H200's clock): long enough to cover the host's recording of the start event and launching
# the graph, even on a slow host, so that the events time the segment's kernels and not the launch latency.
SEGMENT_LEAD_CYCLES = 400_000
# The host reference's iterations (host_reference): about as much host work as a runner's own per call.
REFERENCE_OPS = 32

# "tiny" is the suites' size (host-bound on any GPU); "large" gives the GPU real work per layer.
SIZES: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),
    "large": ModelConfig(vocab_size=32000, hidden_size=1024, intermediate_size=4096, num_layers=8, num_heads=16),
}
# The full table (README) and the regression-check set: one token and four requests of 31 tokens, the
# batches where replay buys most and least, in the buckets they use. Over these two rows a slowed runner
# moves every model's mean speed-up well past the gate, a rerun stays well within it (README, Benchmarks).
FULL = {"compositions": "1;3;2,2,2,2;4,4,4,4;8,8,8,7", "buckets": "4,8,16,32"}
QUICK = {"compositions": "1;8,8,8,7", "buckets": "4,32"}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="dense,moe", help="zoo models, comma-separated (default dense,moe)")
    parser.add_argument("--sizes", default=None,
                        help=f"model sizes, comma-separated, of {', '.join(SIZES)} (default: both on CUDA, tiny "
                             "on the emulation)")
    parser.add_argument("--quick", action="store_true",
                        help=f"the regression-check set: compositions {QUICK['compositions']}, buckets "
                             f"{QUICK['buckets']} (unless given), both models and sizes")
    parser.add_argument("--compositions", default=None,
                        help=f"batches as request lengths, ';' between batches (default {FULL['compositions']}: "
                             "1 token, 3 tokens, 4 requests of 8, 16 and 31 tokens)")
    parser.add_argument("--buckets", default=None,
                        help=f"token-count buckets, comma-separated (default {FULL['buckets']})")
    parser.add_argument("--architectures", default=",".join(DIVERGENCE_ARCHITECTURES),
                        help="transformers-zoo architectures of the per-layer divergence table, comma-separated "
                             "(empty: no table)")
    parser.add_argument("--dtype", choices=tuple(_DTYPES), default=None,
                        help="model dtype (default bfloat16 on CUDA, float32 on the emulation)")


def _integers(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected comma-separated integers such as 4,8,16") from None
    if not values or any(v <= 0 for v in values):
        raise UsageError(f"{option} {text!r}: expected positive integers")
    return values


def _compositions(text: str) -> list[list[int]]:
    return [list(_integers(c, "--compositions")) for c in text.split(";") if c.strip()]


def settings_of(options: argparse.Namespace, *, device: torch.device) -> dict[str, Any]:
    """What a run with ``options`` measures on ``device``, as its report records it."""
    on_cuda = device.type == "cuda"
    models = [m.strip() for m in options.models.split(",") if m.strip()]
    sizes = [s.strip() for s in (options.sizes or ("tiny,large" if on_cuda else "tiny")).split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise UsageError(f"--sizes: unknown size(s) {', '.join(unknown)}; known: {', '.join(SIZES)}")
    preset = QUICK if options.quick else FULL
    chosen = options.compositions or preset["compositions"]
    compositions = _compositions(chosen)
    buckets = sorted(_integers(options.buckets or preset["buckets"], "--buckets"))
    too_big = [c for c in compositions if sum(c) > buckets[-1]]
    if too_big:
        raise UsageError(f"--compositions {too_big[0]} has {sum(too_big[0])} tokens, more than the largest bucket "
                         f"{buckets[-1]}")
    return {"models": models, "sizes": sizes, "compositions": compositions, "buckets": buckets,
            "dtype": options.dtype or ("bfloat16" if on_cuda else "float32")}


def arguments_for(recorded: dict[str, Any]) -> list[str]:
    """The options of a run that measures what ``recorded`` (a report's settings) holds."""
    quick = (recorded["compositions"] == _compositions(QUICK["compositions"])
             and recorded["buckets"] == sorted(_integers(QUICK["buckets"], "--buckets")))
    batches = ["--quick"] if quick else [
        "--compositions", ";".join(",".join(map(str, lengths)) for lengths in recorded["compositions"]),
        "--buckets", ",".join(map(str, recorded["buckets"]))]
    return ["--models", ",".join(recorded["models"]), "--sizes", ",".join(recorded["sizes"]), *batches,
            "--dtype", recorded["dtype"]]


@dataclasses.dataclass
class _Replayed:
    """What one instrumented call measured inside its graph replays (milliseconds)."""

    segments_gpu: float = 0.0
    breaks_gpu: float = 0.0
    breaks_host: float = 0.0
    host_in_graphs: float = 0.0
    segments: int = 0


class _Probe:
    """Per-replay accounting of the instrumented graphs while ``enabled``: each captured segment's GPU time
    and each eager break's GPU time (CUDA events; none off CUDA) and host time, and the host time spent inside
    graph replays, until :meth:`drain`."""

    def __init__(self, *, gpu: bool = False) -> None:
        self.enabled = False
        self.gpu = gpu
        self.pending: list[tuple[str, Any, Any]] = []
        self.replayed = _Replayed()

    def drain(self) -> _Replayed:
        """What the replays since the last drain measured; waits for their events."""
        replayed, self.replayed = self.replayed, _Replayed()
        for kind, start, end in self.pending:
            end.synchronize()
            if kind == "segment":
                replayed.segments_gpu += start.elapsed_time(end)
            else:
                replayed.breaks_gpu += start.elapsed_time(end)
        self.pending = []
        return replayed


class _TimedGraph(BreakableGraph):
    probe: _Probe

    def replay(self) -> Any:
        probe = self.probe
        if not probe.enabled:
            return super().replay()
        entered = time.perf_counter()
        replayed = probe.replayed
        for step in self.steps:
            is_break = isinstance(step, Break)
            if probe.gpu:
                if not is_break:
                    # The segment's time must not depend on the host: with GPU work queued ahead of it, the GPU
                    # is still busy when the host has recorded the start event and launched the graph, so the
                    # events enclose the segment's kernels alone. Without it they also enclose the host's launch
                    # latency, which moves with the host's speed, as the breaks' times do.
                    torch.cuda._sleep(SEGMENT_LEAD_CYCLES)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            began = time.perf_counter()
            if isinstance(step, Break):
                self.replay_break(step)
                replayed.breaks_host += (time.perf_counter() - began) * 1e3
            else:
                step.replay()
                replayed.segments += 1
            if probe.gpu:
                end.record()
                probe.pending.append(("break" if is_break else "segment", start, end))
        replayed.host_in_graphs += (time.perf_counter() - entered) * 1e3
        return self.output


class InstrumentedCapturer(GraphCapturer):
    """The reference capturer, recording per capture its time, pool growth, segments and breaks, and able
    to time each segment and break at replay. The runner under test receives it as ``graphs``."""

    graph_class = _TimedGraph

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self.probe = _Probe(gpu=backend.name == "cuda")
        self.captures: list[dict[str, Any]] = []

    def capture(self, fn: Callable[[], Any], *, pool: Any = None, warmup_runs: int = 1) -> BreakableGraph:
        on_cuda = self.backend.name == "cuda"
        device = getattr(self.backend, "device", None)
        if on_cuda:
            torch.cuda.synchronize(device)
            reserved = torch.cuda.memory_reserved(device)
        started = time.perf_counter()
        graph = super().capture(fn, pool=pool, warmup_runs=warmup_runs)
        if on_cuda:
            torch.cuda.synchronize(device)
        graph.probe = self.probe
        self.captures.append({
            "tokens": _leading_size(graph.output),
            "capture_s": time.perf_counter() - started if on_cuda else None,  # emulation: counts only
            "pool_mib": (torch.cuda.memory_reserved(device) - reserved) / 2**20 if on_cuda else None,
            "segments": graph.segment_count, "breaks": graph.break_count,
        })
        return graph


def _leading_size(value: Any) -> int | None:
    """The first dimension of the first tensor in ``value``: the bucket a layer-stack capture ran."""
    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() else None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = [getattr(value, field.name) for field in dataclasses.fields(value)]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    for item in items:
        size = _leading_size(item)
        if size is not None:
            return size
    return None


@contextlib.contextmanager
def _stubbed_stack(model: torch.nn.Module, batch: ForwardBatch) -> Iterator[None]:
    """The layer stack replaced by a function handing back its real output for ``batch``: what is left of
    a forward is the model's eager glue (embedding, logits processing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stack = discover_layer_model(model).module
    real_forward = stack.forward
    outputs: list[Any] = []

    def record(*args: Any, **kwargs: Any) -> Any:
        outputs.append(real_forward(*args, **kwargs))
        return outputs[-1]

    stack.forward = record
    try:
        with torch.no_grad():
            model(batch.input_ids, batch.positions, batch)
        stack.forward = lambda *args, **kwargs: outputs[0]
        yield
    finally:
        del stack.forward


def _fallbacks(runner: Any) -> int | None:
    stats = getattr(runner, "stats", None)
    return getattr(stats, "eager_fallbacks", None)


def _launches(fn: Callable[[], Any], device: torch.device) -> dict[str, float | None]:
    fn()
    # One profiled call after a warm-up: a steady-state call launches the same each time, and every profiled
    # call adds the profiler's processing of its events to the run's time.
    counted = count_launches(fn, device=device, calls=1)
    if device.type == "cuda":
        return {"launches": counted.host_launches, "kernels": counted.kernels}
    return {"launches": counted.aten_ops, "kernels": None}


@dataclasses.dataclass(frozen=True)
class _ReferenceStep:
    index: int
    tensor: torch.Tensor


def host_reference(device: torch.device) -> Callable[[], None]:
    """A fixed piece of host work like a runner's own host path: Python-level work (a dataclass replaced, a
    context entered, as runners do with batches and patches) and small tensor copies and clones (one launch
    each on CUDA), timed beside every sample of the runner's. The ratio of the two does not move with how
    fast the host happens to be, which on a shared GPU host changes between runs and within one."""
    source = torch.zeros(64, device=device)
    target = torch.empty_like(source)

    def work() -> None:
        step = _ReferenceStep(0, source)
        for index in range(REFERENCE_OPS):
            step = dataclasses.replace(step, index=index)
            with contextlib.nullcontext():
                target.copy_(step.tensor)
                step.tensor[:32].clone()

    return work


def measure_split(run_call: Callable[[], Any], capturer: InstrumentedCapturer, reference: Callable[[], None], *,
                  device: torch.device, samples: int) -> dict[str, Stat | None]:
    """``samples`` instrumented calls of ``run_call``, each after one call of ``reference``: the captured
    segments' GPU time (``segments_gpu``; CUDA only), the eager breaks' GPU and host time (``breaks_gpu``,
    ``breaks_host``), the call's host time outside graph replays (``runner_host``: the runner's own work and
    the model's eager glue), the reference's host time (``host_reference``) and, per sample, the ratio of the
    two (``host_ratio``), all in ms. Segment and break figures are None when no captured graph replayed."""
    probe = capturer.probe
    on_cuda = probe.gpu
    probe.drain()
    figures: dict[str, list[float]] = {name: [] for name in (
        "segments_gpu", "breaks_gpu", "breaks_host", "runner_host", "host_reference", "host_ratio")}
    segments = 0
    for _ in range(samples):
        synchronize(device)  # every sample starts from an idle GPU
        started = time.perf_counter()
        reference()
        referenced = time.perf_counter()
        probe.enabled = True
        try:
            run_call()
            ended = time.perf_counter()
        finally:
            probe.enabled = False
        replayed = probe.drain()
        synchronize(device)
        segments += replayed.segments
        host = max((ended - referenced) * 1e3 - replayed.host_in_graphs, 0.0)
        reference_ms = (referenced - started) * 1e3
        figures["segments_gpu"].append(replayed.segments_gpu)
        figures["breaks_gpu"].append(replayed.breaks_gpu)
        figures["breaks_host"].append(replayed.breaks_host)
        figures["runner_host"].append(host)
        figures["host_reference"].append(reference_ms)
        figures["host_ratio"].append(host / reference_ms if reference_ms > 0 else 0.0)
    split: dict[str, Stat | None] = {name: Stat.of(values) for name, values in figures.items()}
    if not segments:  # a runner that never replayed the captured graphs
        split.update(segments_gpu=None, breaks_gpu=None, breaks_host=None)
    elif not on_cuda:  # no events: host times only
        split.update(segments_gpu=None, breaks_gpu=None)
    return split


def _measure_batch(runner: Any, model: torch.nn.Module, capturer: InstrumentedCapturer, lengths: list[int], *,
                   device: torch.device, repeat: int, config: ModelConfig
                   ) -> tuple[dict[str, Any], Callable[[], dict[str, Stat | None]] | None]:
    """The row of one batch composition, and (CUDA) how to measure its split again."""
    batch = ForwardBatch.from_lengths(lengths, vocab_size=config.vocab_size, seed=len(lengths), device=device)
    run_call = getattr(runner, "run", None) or runner.replay

    def eager() -> Any:
        with torch.no_grad():
            return model(batch.input_ids, batch.positions, batch)

    def replay() -> Any:
        return run_call(batch)

    before = _fallbacks(runner)
    replay()
    after = _fallbacks(runner)
    row: dict[str, Any] = {
        "batch": "+".join(map(str, lengths)), "requests": len(lengths), "tokens": sum(lengths),
        "bucket": min((b for b in runner.buckets if b >= sum(lengths)), default=None)
        if hasattr(runner, "buckets") else None,
        "eager_fallbacks": None if before is None or after is None else after - before,
    }
    eager_counts, run_counts = _launches(eager, device), _launches(replay, device)
    row.update(launches_eager=eager_counts["launches"], launches_run=run_counts["launches"],
               kernels_eager=eager_counts["kernels"], kernels_run=run_counts["kernels"])
    if device.type != "cuda":
        return row, None
    eager_time = time_call(eager, device=device, repeat=repeat)
    run_time = time_call(replay, device=device, repeat=repeat)
    row.update(eager=eager_time.gpu, eager_wall=eager_time.wall, run=run_time.gpu, run_wall=run_time.wall,
               speedup=run_time.gpu.ratio_to(eager_time.gpu))
    # The split: a second pass with events around every segment and break (they and the GPU work queued
    # before each segment cost time, which is why the headline time comes from the uninstrumented pass above).
    reference = host_reference(device)

    def split() -> dict[str, Stat | None]:
        return measure_split(replay, capturer, reference, device=device, samples=max(repeat, HOST_SAMPLES))

    row.update(split())
    with _stubbed_stack(model, batch):
        row["glue"] = time_call(eager, device=device, repeat=repeat).gpu
    return row, split


# Models kept for the next run in this process (shared_models): None when every run builds its own.
_SHARED_MODELS: dict[tuple[str, str, str, str], torch.nn.Module] | None = None


@contextlib.contextmanager
def shared_models() -> Iterator[None]:
    """Runs inside the block build each zoo model (name, size, dtype, device) once and reuse it, for several
    runs in one process (the bench step's slow variants): building the large models is a large part of a run.
    Only for runners that leave the model as they found it, as the reference's variants do."""
    global _SHARED_MODELS
    outer, _SHARED_MODELS = _SHARED_MODELS, _SHARED_MODELS if _SHARED_MODELS is not None else {}
    try:
        yield
    finally:
        _SHARED_MODELS = outer


def _model(name: str, size: str, dtype: str, device: torch.device) -> torch.nn.Module:
    key = (name, size, dtype, str(device))
    if _SHARED_MODELS is not None and key in _SHARED_MODELS:
        return _SHARED_MODELS[key]
    model = build_model(name, seed=0, dtype=_DTYPES[dtype], device=device, config=SIZES[size])
    if _SHARED_MODELS is not None:
        _SHARED_MODELS[key] = model
    return model


def run(options: argparse.Namespace, *, device: torch.device, backend: Any, implementations: dict[str, Any],
        repeat: int) -> Result:
    """Capture and measure every model, size and batch composition. The runners stay alive until the
    result goes, so that a suspected regression can be measured again (:attr:`Result.remeasure`)."""
    settings = settings_of(options, device=device)
    (spec, implementation), = implementations.items()
    rows: list[dict[str, Any]] = []
    splits: dict[str, tuple[dict[str, Any], Callable[[], dict[str, Stat | None]]]] = {}
    for size in settings["sizes"]:
        for name in settings["models"]:
            config = SIZES[size]
            model = _model(name, size, settings["dtype"], device)
            capturer = InstrumentedCapturer(backend)
            synchronize(device)
            started = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                runner = implementation.obj(model, buckets=settings["buckets"], graphs=capturer)
            synchronize(device)
            capture_total = time.perf_counter() - started
            rows.append({"model": name, "size": size, "kind": "capture", "captures": capturer.captures,
                         "capture_total_s": capture_total if device.type == "cuda" else None,
                         "pool_total_mib": sum(c["pool_mib"] for c in capturer.captures)
                         if device.type == "cuda" else None})
            for lengths in settings["compositions"]:
                measured, split = _measure_batch(runner, model, capturer, lengths, device=device, repeat=repeat,
                                                 config=config)
                row = {"model": name, "size": size, "kind": "batch", **measured}
                rows.append(row)
                if split is not None:
                    splits[f"{name}/{size}/{row['batch']}"] = (row, split)
    names = [n.strip() for n in options.architectures.split(",") if n.strip()]
    divergence = architecture_divergence(names, graphs=GraphCapturer(backend), device=device,
                                         runner_factory=implementation.obj)
    extra = {"layer_divergence": {name: report if isinstance(report, str) else dataclasses.asdict(report)
                                  for name, report in divergence.items()}}

    def remeasure(keys: Sequence[str]) -> dict[str, Figure]:
        """Fresh figures of the rows of ``keys`` (``model/size/batch/figure``), their split measured again."""
        fresh: dict[str, Figure] = {}
        for row_key in dict.fromkeys(key.rsplit("/", 1)[0] for key in keys):
            if row_key in splits:
                row, split = splits[row_key]
                fresh.update(figures_of([{**row, **split()}]))
        return {key: fresh[key] for key in keys if key in fresh}

    return Result(settings, rows, figures_of(rows), extra, remeasure=remeasure if splits else None)


def figures_of(rows: list[dict[str, Any]]) -> dict[str, Figure]:
    """The compared figures of a run's rows (times as :class:`Stat`; absent on the emulation).

    Gated: counts per capture and per batch; per batch on CUDA the captured segments' GPU time, and the
    runner's host overhead as a ratio to the host reference, grouped by model and size (a baseline gates
    each model's by their geometric mean). Reported: the eager and run times, the speed-up (grouped by model
    and size, the group's mean reported too), the breaks' GPU and host time and the host overhead in ms.
    """
    figures: dict[str, Figure] = {}
    for row in rows:
        prefix = f"{row['model']}/{row['size']}"
        if row["kind"] == "capture":
            # Keyed by capture order: the leading size of a capture's output is the bucket only when the
            # layer stack was captured (a whole-model fallback returns per-request logits).
            for index, capture in enumerate(row["captures"]):
                figures[f"{prefix}/capture{index}/segments"] = Figure.count(capture["segments"])
                figures[f"{prefix}/capture{index}/breaks"] = Figure.count(capture["breaks"])
            figures[f"{prefix}/captures"] = Figure.count(len(row["captures"]))
            continue
        key = f"{prefix}/{row['batch']}"
        for field in ("launches_eager", "launches_run", "eager_fallbacks"):
            figures[f"{key}/{field}"] = Figure.count(row[field])
        if isinstance(row.get("speedup"), Stat):
            figures[f"{key}/eager_ms"] = Figure.time(row["eager"], "ms")
            figures[f"{key}/run_ms"] = Figure.time(row["run"], "ms")
            figures[f"{key}/speedup"] = Figure.speedup(row["speedup"], group=prefix)
        # Rows of gate version 1 (tests/data) hold "segments" and "overhead" instead: measured with the host's
        # launch latency inside, they are not figures of this version.
        if isinstance(row.get("segments_gpu"), Stat):
            figures[f"{key}/segments_gpu_ms"] = Figure.time(row["segments_gpu"], "ms", gated=True)
        for field in ("breaks_gpu", "breaks_host", "runner_host"):
            if isinstance(row.get(field), Stat):
                figures[f"{key}/{field}_ms"] = Figure.time(row[field], "ms")
        if isinstance(row.get("host_ratio"), Stat):
            figures[f"{key}/runner_host_ratio"] = Figure.time(row["host_ratio"], "x", gated=True, group=prefix)
    return figures


def format_table(result: Result, *, device: torch.device) -> str:
    rows = result.rows
    on_cuda = device.type == "cuda"
    unit = "host launches" if on_cuda else "ATen ops"
    lines = []
    captures = [r for r in rows if r["kind"] == "capture"]
    lines.append(f"{'model':<16} {'captures (output rows: seconds, pool MiB, segments/breaks)'}")
    for row in captures:
        parts = [f"{c['tokens']}: " + (f"{c['capture_s']:.2f}s, " if c["capture_s"] is not None else "")
                 + (f"{c['pool_mib']:.1f} MiB, " if c["pool_mib"] is not None else "")
                 + f"{c['segments']}/{c['breaks']}" for c in row["captures"]]
        total = f"; pool total {row['pool_total_mib']:.1f} MiB" if row["pool_total_mib"] is not None else ""
        lines.append(f"{row['model'] + '/' + row['size']:<16} " + " | ".join(parts) + total)
    lines.append("")
    header = f"{'model':<16} {'batch':<10} {'bucket':>6} {unit + ' eager->run':>24} {'fallbacks':>9}"
    if on_cuda:
        header += (f" {'eager ms':>13} {'run ms':>13} {'speed-up':>12} {'segments GPU':>13} {'breaks ms':>13}"
                   f" {'breaks host':>13} {'glue ms':>13} {'runner host':>13} {'runner/ref':>12}")
    lines += [header, "-" * len(header)]
    for row in (r for r in rows if r["kind"] == "batch"):
        launches = f"{_number(row['launches_eager'])} -> {_number(row['launches_run'])}"
        line = (f"{row['model'] + '/' + row['size']:<16} {row['batch']:<10} {_number(row['bucket']):>6} "
                f"{launches:>24} {_number(row['eager_fallbacks']):>9}")
        if on_cuda:
            line += "".join(f" {format_stat(row[k]):>13}" for k in ("eager", "run"))
            line += f" {format_stat(row['speedup'], unit='x'):>12}"
            line += "".join(f" {format_stat(row.get(k)):>13}"
                            for k in ("segments_gpu", "breaks_gpu", "breaks_host", "glue", "runner_host"))
            line += f" {format_stat(row.get('host_ratio'), unit='x'):>12}"
        lines.append(line)
    if on_cuda:
        lines.append("times: median ±(interquartile range / median) over the repeats (the split: over at least "
                     f"{HOST_SAMPLES}); GPU time by CUDA events, host time by the host clock. 'segments GPU': the "
                     "captured segments' kernels, timed with the GPU kept ahead of the host; 'breaks ms' and "
                     "'breaks host': the eager breaks on the GPU timeline and on the host; 'runner host': the "
                     "call's host time outside graph replays (the runner's own work and the model's glue); "
                     "'runner/ref': that over a fixed reference piece of host work timed beside it. Gated against a "
                     "baseline: the counts, 'segments GPU' and each model's 'runner/ref'; the rest is reported.")
    divergence = result.extra.get("layer_divergence") or {}
    if divergence:
        lines += ["", "per-layer divergence of the layer stack, replay vs eager (transformers zoo):",
                  format_divergence_table({name: report if isinstance(report, str) else LayerDivergence(
                      tuple(report["max_abs_diff"]), report["first_divergent"], report["atol"])
                      for name, report in divergence.items()})]
    return "\n".join(lines)


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:g}"


def plot(result: Result, path: str) -> None:
    rows = result.rows
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        if row["kind"] == "batch" and isinstance(row.get("speedup"), Stat):
            label = f"{row['model']}/{row['size']}, {row['requests']} request(s)"
            series.setdefault(label, []).append((row["tokens"], row["speedup"].median))
    plot_speedups(path, title="runner: replay vs eager", xlabel="tokens in the batch", series=series)
