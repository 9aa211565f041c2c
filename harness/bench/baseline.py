"""Comparing a benchmark run with a stored baseline: :func:`compare`, :func:`failed`, :class:`Thresholds`.

Counts are exact, grouped speed-ups are gated beyond a noise band, times are only reported; the
README's Benchmarks section states the policy. A baseline of another benchmark, device class or
settings is a usage error (:func:`check_comparable`), not a verdict."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from harness.errors import UsageError

__all__ = ["Thresholds", "Finding", "check_comparable", "compare", "failed", "format_findings"]

# Settings that may differ between a run and its baseline: they change precision, not what is measured.
_FREE_SETTINGS = frozenset({"repeat"})
_FAILING = frozenset({"regression", "changed", "missing"})
_REPORTED = frozenset({"improved", "new", "unmeasured", "slower", "faster"})
_GROUP_SUFFIX = "/speedup (geometric mean)"


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """``floor`` and ``noise_factor``: the band of one time or speed-up, ``max(floor, noise_factor x
    spread)``; ``speedup_floor`` and ``group_noise_factor``: the band of a group's mean speed-up,
    ``max(speedup_floor, group_noise_factor x standard error)``. The default speed-up floor lies between
    how far a rerun moved a group's mean and how far a slowed runner moved it (README, Benchmarks)."""

    floor: float = 0.15
    noise_factor: float = 3.0
    speedup_floor: float = 0.25
    group_noise_factor: float = 2.0

    def __post_init__(self) -> None:
        negative = [f"{field.name.replace('_', ' ')} {getattr(self, field.name)}"
                    for field in dataclasses.fields(self) if getattr(self, field.name) < 0]
        if negative:
            raise UsageError(f"thresholds must be >= 0; got {', '.join(negative)}")

    def band(self, spread_now: float, spread_baseline: float) -> float:
        return max(self.floor, self.noise_factor * max(spread_now, spread_baseline))

    def group_band(self, spreads: Sequence[float]) -> float:
        error = math.sqrt(sum(s * s for s in spreads) / len(spreads)) / math.sqrt(len(spreads))
        return max(self.speedup_floor, self.group_noise_factor * error)


@dataclasses.dataclass(frozen=True)
class Finding:
    """The verdict on one figure or speed-up group. ``ok``, ``improved``, ``new``, ``unmeasured`` pass,
    and so do ``slower`` and ``faster`` (beyond the band of a figure that is reported, not gated);
    ``regression``, ``changed``, ``missing`` fail. ``change`` is the relative worsening (time now /
    before - 1; for a speed-up, before / now - 1), ``band`` the noise band it was held against."""

    key: str
    kind: str
    verdict: str
    baseline: float | None
    current: float | None
    change: float | None = None
    band: float | None = None
    gated: bool = True

    @property
    def failed(self) -> bool:
        return self.verdict in _FAILING

    def describe(self) -> str:
        def number(value: float | None) -> str:
            return "absent" if value is None else f"{value:.4g}"

        text = f"{self.verdict:<10} {self.key}: {number(self.baseline)} -> {number(self.current)}"
        if self.change is not None and self.band is not None:
            # A figure that improved reads "better", never as a negative worsening ("-74% worse").
            amount = (f"{self.change * 100:+.1f}% worse" if self.change >= 0
                      else f"{-self.change * 100:.1f}% better")
            text += (f" ({amount}, noise band {self.band * 100:.1f}%"
                     + ("" if self.gated else "; reported, not gated") + ")")
        elif self.kind == "count" and self.verdict == "changed":
            text += " (counts must match exactly)"
        return text


def check_comparable(current: Mapping[str, Any], baseline: Mapping[str, Any], *, rerun: str | None = None) -> None:
    """Raise :class:`UsageError` unless both runs measured the same thing on the same device class.

    ``current`` needs only ``benchmark``, ``environment`` and ``settings``, so a run is checked before it
    measures; ``rerun``, the command line that would match the baseline, ends the message where given."""
    advice = f"; to compare with it, run: {rerun}" if rerun else ""
    if current.get("benchmark") != baseline.get("benchmark"):
        raise UsageError(f"the baseline is a {baseline.get('benchmark')!r} report, this run is "
                         f"{current.get('benchmark')!r}{advice}")
    now_class = current["environment"]["device_class"]
    base_class = baseline["environment"]["device_class"]
    if now_class != base_class:
        raise UsageError(f"the baseline was measured on {base_class!r}, this run on {now_class!r}; compare runs "
                         f"of one device class (harness/bench/baselines/ has one file per class){advice}")
    now = {k: v for k, v in current["settings"].items() if k not in _FREE_SETTINGS}
    base = {k: v for k, v in baseline["settings"].items() if k not in _FREE_SETTINGS}
    if now != base:
        differ = sorted(k for k in set(now) | set(base) if now.get(k) != base.get(k))
        details = "; ".join(f"{k}: baseline {base.get(k)!r}, now {now.get(k)!r}" for k in differ)
        raise UsageError(f"the baseline was measured with other settings ({details})"
                         + (advice or "; rerun with the baseline's settings or record a new baseline"))


def _worsening(kind: str, before: Any, after: Any) -> float | None:
    """``now / before - 1`` for a time, ``before / now - 1`` for a speed-up; None without a ratio."""
    if before is None or after is None or before <= 0 or after <= 0:
        return None
    return after / before - 1 if kind == "time" else before / after - 1


def _verdict(change: float, band: float, *, gated: bool) -> str:
    if change > band:
        return "regression" if gated else "slower"
    if (1 + change) * (1 + band) < 1:
        return "improved" if gated else "faster"
    return "ok"


def _group(base: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    # The run's grouping wins: a baseline written before groups existed is read with today's groups.
    return now.get("group") or base.get("group")


def _compare_one(key: str, base: Mapping[str, Any], now: Mapping[str, Any], thresholds: Thresholds) -> Finding:
    kind, before, after = base["kind"], base["value"], now["value"]
    if now["kind"] != kind:
        return Finding(key, kind, "changed", before, after)
    if kind == "count":
        return Finding(key, kind, "ok" if before == after else "changed", before, after)
    gated = kind == "speedup" and _group(base, now) is None
    change = _worsening(kind, before, after)
    if change is None:
        return Finding(key, kind, "unmeasured", before, after, gated=gated)
    band = thresholds.band(float(now.get("spread", 0.0)), float(base.get("spread", 0.0)))
    return Finding(key, kind, _verdict(change, band, gated=gated), before, after, change, band, gated)


def _compare_group(group: str, pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
                   thresholds: Thresholds) -> Finding:
    """The gated verdict of one group: the geometric mean of its rows' speed-up worsening."""
    key = group + _GROUP_SUFFIX
    measured = [(b["value"], n["value"], max(float(b.get("spread", 0.0)), float(n.get("spread", 0.0))))
                for b, n in pairs if _worsening("speedup", b["value"], n["value"]) is not None]
    if not measured:
        return Finding(key, "speedup", "unmeasured", None, None)
    before = math.exp(sum(math.log(b) for b, _, _ in measured) / len(measured))
    now = math.exp(sum(math.log(n) for _, n, _ in measured) / len(measured))
    change = before / now - 1  # = the geometric mean of the rows' before / now, minus 1
    band = thresholds.group_band([spread for _, _, spread in measured])
    return Finding(key, "speedup", _verdict(change, band, gated=True), before, now, change, band)


def compare(current: Mapping[str, Any], baseline: Mapping[str, Any], *,
            thresholds: Thresholds = Thresholds()) -> list[Finding]:
    """One :class:`Finding` per figure of either run (the baseline's order, new figures after), then one
    per speed-up group, over the group's rows present in both runs."""
    check_comparable(current, baseline)
    now_figures, base_figures = current["figures"], baseline["figures"]
    findings = []
    groups: dict[str, list[tuple[Mapping[str, Any], Mapping[str, Any]]]] = {}
    for key, base in base_figures.items():
        if key not in now_figures:
            findings.append(Finding(key, base["kind"], "missing", base["value"], None))
            continue
        now = now_figures[key]
        findings.append(_compare_one(key, base, now, thresholds))
        group = _group(base, now)
        if base["kind"] == now["kind"] == "speedup" and group is not None:
            groups.setdefault(group, []).append((base, now))
    findings += [Finding(key, now["kind"], "new", None, now["value"])
                 for key, now in now_figures.items() if key not in base_figures]
    findings += [_compare_group(group, pairs, thresholds) for group, pairs in groups.items()]
    return findings


def failed(findings: Sequence[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.failed]


def format_findings(findings: Sequence[Finding], *, baseline_path: str, thresholds: Thresholds) -> str:
    """The verdict block: the policy, every failing or notable finding, every group's, a summary line."""
    bad = failed(findings)
    gated = [f for f in findings if f.gated]
    lines = [f"baseline {baseline_path}: {len(findings)} findings, {len(gated)} gated: counts exactly, each "
             f"model's speed-ups by their geometric mean beyond max({thresholds.speedup_floor * 100:.0f}%, "
             f"{thresholds.group_noise_factor:g} standard errors); times and single speed-ups reported beyond "
             f"max({thresholds.floor * 100:.0f}%, {thresholds.noise_factor:g} x spread), never failed"]
    lines += ["  " + f.describe() for f in findings
              if f.failed or f.verdict in _REPORTED or f.key.endswith(_GROUP_SUFFIX)]
    lines.append(f"REGRESSION: {len(bad)} of {len(gated)} gated findings" if bad
                 else f"no regression: {len(gated)} gated findings within their bands")
    return "\n".join(lines)
