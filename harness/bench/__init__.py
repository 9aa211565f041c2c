"""Benchmarks: ``python -m harness bench {runner,gather,tolerance}``, each a table and JSON.

Benchmarks are commands, never tests; the README's Benchmarks section describes them, their shared
options and how ``--baseline`` compares a run with the committed baselines in ``harness/bench/baselines/``
(and confirms a suspected regression by re-measuring it)."""

from harness.bench.baseline import Finding, Thresholds, compare, confirm, failed, format_findings
from harness.bench.command import BENCHMARKS, main
from harness.bench.report import Figure, Result, Stat, read_json

__all__ = ["BENCHMARKS", "main", "Figure", "Result", "Stat", "read_json", "Thresholds", "Finding", "compare",
           "confirm", "failed", "format_findings"]
