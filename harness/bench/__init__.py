"""Benchmarks: what the optimisations buy, as commands that print a table and write JSON.

``python -m harness bench {runner,gather,tolerance} [--baseline FILE.json] ...`` (see
:mod:`harness.bench.command`). Reports share one shape (:mod:`harness.bench.report`); a run is
compared with a stored baseline by :mod:`harness.bench.baseline` (counts exactly, times by ratio
beyond a measured noise band). Committed baselines live in ``harness/bench/baselines/``, one file
per benchmark and device class. Benchmarks are never tests: tests check the comparison logic only.
"""

from harness.bench.baseline import Finding, Thresholds, compare, failed, format_findings
from harness.bench.command import BENCHMARKS, main
from harness.bench.report import Figure, Result, Stat, read_json

__all__ = ["BENCHMARKS", "main", "Figure", "Result", "Stat", "read_json", "Thresholds", "Finding", "compare",
           "failed", "format_findings"]
