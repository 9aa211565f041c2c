"""What every benchmark reports: the environment header, rows, figures with their spread, JSON, a plot.

A figure is a named number of kind ``count`` (exact), ``time`` or ``speedup``; a time is gated (beyond a
noise band, alone or by group) or reported only, and speed-ups are reported only. On the emulated backend
only counts are produced. The README's Benchmarks section explains how :mod:`harness.bench.baseline`
compares them."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import platform
import shutil
import statistics
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from harness.errors import UsageError

__all__ = [
    "SCHEMA",
    "FIGURE_KINDS",
    "DEFAULT_GATE_VERSION",
    "Stat",
    "Figure",
    "Result",
    "environment",
    "format_header",
    "format_stat",
    "make_report",
    "write_json",
    "read_json",
    "check_plot_extra",
    "plot_speedups",
]

SCHEMA = 1
FIGURE_KINDS = ("count", "time", "speedup")
# What a report's figures are gated on is versioned per benchmark (a module's ``GATE_VERSION``, written as the
# report's ``gate_version``): a baseline of another version holds other gated figures and cannot be compared.
# Reports written before the field existed are version 1.
DEFAULT_GATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Stat:
    """The median of repeated measurements, their relative spread (interquartile range / median) and
    the fastest sample (``low``; kept in the JSON so that runs can be compared on it as well)."""

    median: float
    spread: float
    repeats: int
    low: float | None = None

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stat:
        if not samples:
            raise ValueError("a statistic needs at least one sample")
        ordered = sorted(samples)
        median = statistics.median(ordered)
        if len(ordered) >= 4:
            quartiles = statistics.quantiles(ordered, n=4, method="inclusive")
            spread = (quartiles[2] - quartiles[0]) / median if median else 0.0
        else:  # too few repeats for quartiles: the full range is the honest spread
            spread = (ordered[-1] - ordered[0]) / median if median else 0.0
        return cls(median, spread, len(ordered), ordered[0])

    def ratio_to(self, other: Stat) -> Stat:
        """``other / self`` (a speed-up of self over other), spreads combined in quadrature; no ``low``
        (a ratio of two fastest samples is not the fastest ratio)."""
        value = other.median / self.median if self.median else float("inf")
        return Stat(value, (self.spread ** 2 + other.spread ** 2) ** 0.5, min(self.repeats, other.repeats))


@dataclasses.dataclass(frozen=True)
class Figure:
    """One compared number: ``kind`` in :data:`FIGURE_KINDS`, ``spread`` relative (0 for counts) over
    ``repeats`` samples, ``group``: the figures compared together by their geometric mean, ``gated``:
    whether a change beyond its band fails (counts always are; see :mod:`harness.bench.baseline`)."""

    kind: str
    value: float | None
    spread: float = 0.0
    unit: str = ""
    group: str | None = None
    gated: bool = False
    repeats: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in FIGURE_KINDS:
            raise ValueError(f"figure kind {self.kind!r} is not one of {FIGURE_KINDS}")
        if self.kind == "speedup" and self.gated:
            raise ValueError("speed-ups are reported, not gated: a ratio of two separately timed host-bound "
                             "figures swings with the host")

    @classmethod
    def count(cls, value: float | None, unit: str = "") -> Figure:
        return cls("count", value, 0.0, unit, gated=True)

    @classmethod
    def time(cls, stat: Stat, unit: str, *, gated: bool = False, group: str | None = None) -> Figure:
        return cls("time", stat.median, stat.spread, unit, group, gated, stat.repeats)

    @classmethod
    def speedup(cls, stat: Stat, *, group: str | None = None) -> Figure:
        return cls("speedup", stat.median, stat.spread, "x", group, False, stat.repeats)


@dataclasses.dataclass
class Result:
    """What a benchmark's ``run`` returns: its settings, table rows (values may be :class:`Stat`),
    compared figures, and anything else worth keeping in the JSON (``extra``).

    ``remeasure``, where the benchmark can, measures the rows of the given figure keys again and returns
    their fresh figures (keyed like ``figures``): how a suspected regression is confirmed before it fails.
    It is not part of the JSON."""

    settings: dict[str, Any]
    rows: list[dict[str, Any]]
    figures: dict[str, Figure]
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    remeasure: Callable[[Sequence[str]], Mapping[str, Figure]] | None = dataclasses.field(default=None, repr=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Stat):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        completed = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = completed.stdout.strip().splitlines()
    return lines[0].strip() if completed.returncode == 0 and lines else None


def environment(device: torch.device, graph_backend: str) -> dict[str, Any]:
    """The header every report starts with; ``device_class`` is what baselines must share."""
    on_cuda = device.type == "cuda"
    gpu = torch.cuda.get_device_name(device) if on_cuda else None
    emulated = graph_backend == "emulated"
    return {
        "device": str(device),
        "gpu": gpu,
        "driver": _driver_version() if on_cuda else None,
        "cuda": torch.version.cuda,
        "cpu": platform.processor() or platform.machine(),
        "graph_backend": graph_backend,
        "emulated": emulated,
        # A baseline is only comparable with a run of the same class: same GPU model and backend.
        "device_class": f"{'cuda:' + gpu if on_cuda else 'cpu'}/{graph_backend}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton") or _version("pytorch-triton"),
        "transformers": _version("transformers"),
    }


def format_header(title: str, env: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    where = env["gpu"] or env["cpu"]
    lines = [f"{title} on {env['device']} ({where}), graph backend {env['graph_backend']}",
             f"torch {env['torch']} (CUDA {env['cuda']}), triton {env['triton']}, transformers "
             f"{env['transformers']}, driver {env['driver']}, python {env['python']}",
             "settings: " + ", ".join(f"{key} {value}" for key, value in settings.items())]
    if env["emulated"] or env["device"] == "cpu":
        lines.append("EMULATION: the CPU stand-in for CUDA graphs. Launches are top-level ATen ops, and only "
                     "counts are reported: CPU time of an emulation makes no speed claim about a GPU.")
    return "\n".join(lines)


def format_stat(stat: Stat | None, *, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    """``1.02 ±3%``: the median (times ``scale``, then ``unit``) and the spread of its repeats; ``-`` when
    not measured."""
    if stat is None:
        return "-"
    return f"{stat.median * scale:.{digits}f}{unit} ±{stat.spread * 100:.0f}%"


def make_report(*, benchmark: str, env: Mapping[str, Any], result: Result, implementation: str,
                gate_version: int = DEFAULT_GATE_VERSION) -> dict[str, Any]:
    """The JSON document of one run; ``noise`` summarises the spreads of its timed figures, ``gate_version``
    names the gated figures' version (the benchmark's ``GATE_VERSION``)."""
    figures = result.figures
    spreads = sorted(f.spread for f in figures.values() if f.kind != "count" and f.value is not None)
    noise = {"timed_figures": len(spreads),
             "median_spread": statistics.median(spreads) if spreads else None,
             "max_spread": spreads[-1] if spreads else None}
    # The implementation is not a setting: comparing a changed implementation with a baseline is the point.
    return {"schema": SCHEMA, "gate_version": gate_version, "benchmark": benchmark, "implementation": implementation,
            "environment": dict(env),
            "settings": _jsonable(result.settings), "rows": _jsonable(result.rows),
            "figures": {k: dataclasses.asdict(f) for k, f in figures.items()}, "noise": noise,
            **_jsonable(result.extra)}


def write_json(report: Mapping[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(report, indent=1, sort_keys=False) + "\n", encoding="utf-8")


def read_json(path: str | Path) -> dict[str, Any]:
    """A report written by :func:`write_json`; a missing or malformed file is a one-line usage error."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"baseline {path}: no such file") from None
    except (OSError, ValueError) as error:
        raise UsageError(f"baseline {path}: not a readable JSON report ({error})") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA or "figures" not in document:
        raise UsageError(f"baseline {path}: not a benchmark report of schema {SCHEMA} (written by --json)")
    return document


def check_plot_extra() -> None:
    """Raise the one-line usage error now, before measuring, when ``--plot`` cannot be honoured."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'llm-graph-harness[plot]' "
                         "(or matplotlib itself)") from None


def plot_speedups(path: str | Path, *, title: str, xlabel: str,
                  series: Mapping[str, Sequence[tuple[float, float]]]) -> None:
    """A PNG of speed-up against ``xlabel``, one line per series; needs the ``plot`` extra."""
    check_plot_extra()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for label, points in series.items():
        xs, ys = zip(*sorted(points)) if points else ((), ())
        axes.plot(xs, ys, marker="o", label=label)
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xscale("log", base=2)
    axes.set_xlabel(xlabel)
    axes.set_ylabel("speed-up over eager (x)")
    axes.set_title(title)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
