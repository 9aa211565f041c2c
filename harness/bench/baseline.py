"""Comparing a benchmark run with a stored baseline: which figures regressed, and by how much.

Rules, per figure kind (see :mod:`harness.bench.report`):

* ``count``: exact. Any change, up or down, is a finding: one more launch is a fusion undone, one
  fewer fallback is a behaviour change someone must look at and re-baseline on purpose.
* ``time`` (lower is better) and ``speedup`` (higher is better): by ratio. The *noise band* of a
  figure is ``max(floor, noise_factor * max(spread now, spread in the baseline))``, spreads being
  the interquartile range of the repeats over their median; only a change beyond the band counts.
  Getting faster beyond the band is reported, never a failure.
* A figure of the baseline that the run lacks is a regression (a silent skip would hide one); a
  figure new in the run is reported only. A time that is not positive in one of the runs (a
  difference of two times that vanished in the noise) has no ratio: it is reported as unmeasured.

A baseline is comparable only with a run of the same benchmark, device class and settings (the
number of repeats aside); anything else is a usage error, not a verdict.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

from harness.errors import UsageError

__all__ = ["Thresholds", "Finding", "check_comparable", "compare", "failed", "format_findings"]

# Settings that may differ between a run and its baseline: they change precision, not what is measured.
_FREE_SETTINGS = frozenset({"repeat"})
_FAILING = frozenset({"regression", "changed", "missing"})


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """``floor``: the smallest relative change of a time ever called a regression; ``noise_factor``:
    how many spreads of the noisier run a change must exceed."""

    floor: float = 0.15
    noise_factor: float = 3.0

    def __post_init__(self) -> None:
        if self.floor < 0 or self.noise_factor < 0:
            raise UsageError(f"thresholds must be >= 0; got floor {self.floor}, noise factor {self.noise_factor}")

    def band(self, spread_now: float, spread_baseline: float) -> float:
        return max(self.floor, self.noise_factor * max(spread_now, spread_baseline))


@dataclasses.dataclass(frozen=True)
class Finding:
    """The verdict on one figure: ``ok``, ``improved``, ``new``, ``unmeasured`` pass; ``regression``,
    ``changed``, ``missing`` fail. ``change`` is the relative worsening (time now / before - 1; for a speed-up,
    before / now - 1), ``band`` the noise band it was held against."""

    key: str
    kind: str
    verdict: str
    baseline: Optional[float]
    current: Optional[float]
    change: Optional[float] = None
    band: Optional[float] = None

    @property
    def failed(self) -> bool:
        return self.verdict in _FAILING

    def describe(self) -> str:
        def number(value: Optional[float]) -> str:
            return "absent" if value is None else f"{value:.4g}"

        text = f"{self.verdict:<10} {self.key}: {number(self.baseline)} -> {number(self.current)}"
        if self.change is not None and self.band is not None:
            text += f" ({self.change * 100:+.1f}% worse, noise band {self.band * 100:.1f}%)"
        elif self.kind == "count" and self.verdict == "changed":
            text += " (counts must match exactly)"
        return text


def check_comparable(current: Mapping[str, Any], baseline: Mapping[str, Any]) -> None:
    """Raise :class:`UsageError` unless both runs measured the same thing on the same device class."""
    if current.get("benchmark") != baseline.get("benchmark"):
        raise UsageError(f"the baseline is a {baseline.get('benchmark')!r} report, this run is "
                         f"{current.get('benchmark')!r}")
    now_class = current["environment"]["device_class"]
    base_class = baseline["environment"]["device_class"]
    if now_class != base_class:
        raise UsageError(f"the baseline was measured on {base_class!r}, this run on {now_class!r}; compare runs "
                         "of one device class (harness/bench/baselines/ has one file per class)")
    now = {k: v for k, v in current["settings"].items() if k not in _FREE_SETTINGS}
    base = {k: v for k, v in baseline["settings"].items() if k not in _FREE_SETTINGS}
    if now != base:
        differ = sorted(k for k in set(now) | set(base) if now.get(k) != base.get(k))
        details = "; ".join(f"{k}: baseline {base.get(k)!r}, now {now.get(k)!r}" for k in differ)
        raise UsageError(f"the baseline was measured with other settings ({details}); rerun with the baseline's "
                         "settings or record a new baseline")


def _compare_one(key: str, base: Mapping[str, Any], now: Mapping[str, Any], thresholds: Thresholds) -> Finding:
    kind, before, after = base["kind"], base["value"], now["value"]
    if now["kind"] != kind:
        return Finding(key, kind, "changed", before, after)
    if kind == "count":
        return Finding(key, kind, "ok" if before == after else "changed", before, after)
    if before is None or after is None or before <= 0 or after <= 0:
        return Finding(key, kind, "unmeasured", before, after)
    band = thresholds.band(float(now.get("spread", 0.0)), float(base.get("spread", 0.0)))
    change = after / before - 1 if kind == "time" else before / after - 1
    if change > band:
        verdict = "regression"
    elif (1 + change) * (1 + band) < 1:
        verdict = "improved"
    else:
        verdict = "ok"
    return Finding(key, kind, verdict, before, after, change, band)


def compare(current: Mapping[str, Any], baseline: Mapping[str, Any], *,
            thresholds: Thresholds = Thresholds()) -> list[Finding]:
    """One :class:`Finding` per figure of either run, in the baseline's order, new figures last."""
    check_comparable(current, baseline)
    now_figures, base_figures = current["figures"], baseline["figures"]
    findings = []
    for key, base in base_figures.items():
        if key not in now_figures:
            findings.append(Finding(key, base["kind"], "missing", base["value"], None))
        else:
            findings.append(_compare_one(key, base, now_figures[key], thresholds))
    findings += [Finding(key, now["kind"], "new", None, now["value"])
                 for key, now in now_figures.items() if key not in base_figures]
    return findings


def failed(findings: Sequence[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.failed]


def format_findings(findings: Sequence[Finding], *, baseline_path: str, thresholds: Thresholds) -> str:
    """The verdict block: every failing or notable figure, then one summary line."""
    bad = failed(findings)
    notable = [f for f in findings if f.failed or f.verdict in ("improved", "new", "unmeasured")]
    lines = [f"baseline {baseline_path}: {len(findings)} figures, counts exact, times beyond "
             f"max({thresholds.floor * 100:.0f}%, {thresholds.noise_factor:g} x spread)"]
    lines += ["  " + finding.describe() for finding in notable]
    lines.append(f"REGRESSION: {len(bad)} of {len(findings)} figures" if bad
                 else f"no regression: {len(findings)} figures within their bands")
    return "\n".join(lines)
