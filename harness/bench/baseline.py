"""Comparing a benchmark run with a stored baseline: :func:`compare`, :func:`confirm`, :func:`failed`,
:class:`Thresholds`.

Counts are exact; gated times fail beyond a noise band, alone or by the geometric mean of a group, and only
when re-measuring confirms them (:func:`confirm`); every other time and every speed-up is reported only. The
README's Benchmarks section states the policy. A baseline of another benchmark, device class, gate version
or settings is a usage error (:func:`check_comparable`), not a verdict."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from harness.bench.report import DEFAULT_GATE_VERSION
from harness.errors import UsageError

__all__ = ["Thresholds", "Finding", "check_comparable", "compare", "confirm", "suspects", "exact_failures", "failed",
           "format_findings", "standard_error", "MEAN_SUFFIX"]

# Settings that may differ between a run and its baseline: they change precision, not what is measured.
_FREE_SETTINGS = frozenset({"repeat"})
_FAILING = frozenset({"regression", "changed", "missing"})
_REPORTED = frozenset({"improved", "new", "unmeasured", "slower", "faster", "unconfirmed"})
MEAN_SUFFIX = " (geometric mean)"


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Bands, as relative changes.

    ``floor`` and ``noise_factor``: the band of a figure that is only reported (a time or speed-up that
    is not gated), ``max(floor, noise_factor x spread)``, spread being the interquartile range over the
    median of the noisier run. ``gate_floor``, ``gate_cap`` and ``gate_z``: the band of a gated time, alone
    or as a group's geometric mean, ``min(gate_cap, max(gate_floor, gate_z x standard error))``.

    Why these defaults: a gated figure is one that the host's speed does not move (GPU time with the GPU
    kept ahead of the host; the runner's host overhead as a ratio to a reference piece of host work timed
    beside it), so its band need not cover a slower host. The floor covers what a standard error cannot
    see (another lease's GPU or host than the baseline's) and stays below the 20%-slower host path the gate
    must catch, with room for that measurement's own error; the cap keeps a noisy run from widening the
    band up to 20%: noise beyond the band is settled by re-measuring (:func:`confirm`), not by a wider band.
    """

    floor: float = 0.15
    noise_factor: float = 3.0
    gate_floor: float = 0.12
    gate_cap: float = 0.15
    gate_z: float = 3.0

    def __post_init__(self) -> None:
        negative = [f"{field.name.replace('_', ' ')} {getattr(self, field.name)}"
                    for field in dataclasses.fields(self) if getattr(self, field.name) < 0]
        if negative:
            raise UsageError(f"thresholds must be >= 0; got {', '.join(negative)}")
        if self.gate_cap < self.gate_floor:
            raise UsageError(f"--gate-cap {self.gate_cap} is below --gate-floor {self.gate_floor}: the band of a gated "
                             "figure is at least the floor and at most the cap")

    def band(self, spread_now: float, spread_baseline: float) -> float:
        """The band of a reported figure."""
        return max(self.floor, self.noise_factor * max(spread_now, spread_baseline))

    def reported_group_band(self, error: float) -> float:
        return max(self.floor, self.noise_factor * error)

    def gate_band(self, error: float) -> float:
        """The band of a gated figure or group whose change has relative standard error ``error``."""
        return min(self.gate_cap, max(self.gate_floor, self.gate_z * error))


def standard_error(spread: float, repeats: int | None) -> float:
    """The relative standard error of a median of ``repeats`` samples whose interquartile range over median
    is ``spread``: a normal sample's standard deviation is IQR / 1.349, and its median's error
    sqrt(pi / 2) standard deviations over sqrt(repeats). With fewer than four samples (no quartiles) or an
    unknown number, the spread itself."""
    if repeats is None or repeats < 4:
        return spread
    return math.sqrt(math.pi / 2) * spread / 1.349 / math.sqrt(repeats)


def _change_error(base: Mapping[str, Any], now: Mapping[str, Any]) -> float:
    """The standard error of the relative change between two figures: their errors in quadrature."""
    return math.hypot(standard_error(float(base.get("spread", 0.0)), base.get("repeats")),
                      standard_error(float(now.get("spread", 0.0)), now.get("repeats")))


@dataclasses.dataclass(frozen=True)
class Finding:
    """The verdict on one figure or group. ``ok``, ``improved``, ``new``, ``unmeasured``, ``unconfirmed``
    (beyond its band at first, within it when re-measured) pass, and so do ``slower`` and ``faster`` (beyond
    the band of a figure that is reported, not gated); ``regression`` (confirmed where it could be
    re-measured), ``changed`` (a count), ``missing`` fail. ``change`` is the relative worsening (time now /
    before - 1; for a speed-up, before / now - 1), ``band`` the noise band it was held against. A group's
    finding names its figures in ``members``; ``remeasured`` holds each re-measurement's (value, change,
    band)."""

    key: str
    kind: str
    verdict: str
    baseline: float | None
    current: float | None
    change: float | None = None
    band: float | None = None
    gated: bool = True
    members: tuple[str, ...] = ()
    remeasured: tuple[tuple[float | None, float | None, float | None], ...] = ()

    @property
    def failed(self) -> bool:
        return self.verdict in _FAILING

    def describe(self) -> str:
        def number(value: float | None) -> str:
            return "absent" if value is None else f"{value:.4g}"

        def amount(change: float) -> str:
            # A figure that improved reads "better", never as a negative worsening ("-74% worse").
            return f"{change * 100:+.1f}% worse" if change >= 0 else f"{-change * 100:.1f}% better"

        text = f"{self.verdict:<10} {self.key}: {number(self.baseline)} -> {number(self.current)}"
        if self.change is not None and self.band is not None:
            text += (f" ({amount(self.change)}, noise band {self.band * 100:.1f}%"
                     + ("" if self.gated else "; reported, not gated") + ")")
        elif self.kind == "count" and self.verdict == "changed":
            text += " (counts must match exactly)"
        if self.remeasured:
            again = [number(value) + (f" ({amount(change)}, band {band * 100:.1f}%)"
                                      if change is not None and band is not None else " (not re-measurable)")
                     for value, change, band in self.remeasured]
            text += "; re-measured: " + ", then ".join(again) + (
                ": within its band, so the first measurement was noise; not failed" if self.verdict == "unconfirmed"
                else ": beyond its band every time, confirmed")
        return text


def check_comparable(current: Mapping[str, Any], baseline: Mapping[str, Any], *, rerun: str | None = None,
                     rerecord: str | None = None) -> None:
    """Raise :class:`UsageError` unless both runs measured the same thing on the same device class and
    gate the same figures (``gate_version``).

    ``current`` needs only ``benchmark``, ``environment``, ``settings`` and ``gate_version``, so a run is
    checked before it measures; ``rerun``, the command line that would match the baseline, ends the message
    where given, and ``rerecord``, the one that records the baseline again, ends a gate version's."""
    advice = f"; to compare with it, run: {rerun}" if rerun else ""
    if current.get("benchmark") != baseline.get("benchmark"):
        raise UsageError(f"the baseline is a {baseline.get('benchmark')!r} report, this run is "
                         f"{current.get('benchmark')!r}{advice}")
    now_class = current["environment"]["device_class"]
    base_class = baseline["environment"]["device_class"]
    if now_class != base_class:
        raise UsageError(f"the baseline was measured on {base_class!r}, this run on {now_class!r}; compare runs "
                         f"of one device class (harness/bench/baselines/ has one file per class){advice}")
    base_version = baseline.get("gate_version", DEFAULT_GATE_VERSION)
    now_version = current.get("gate_version", DEFAULT_GATE_VERSION)
    if base_version != now_version:
        raise UsageError(f"the baseline holds the figures of gate version {base_version} of bench "
                         f"{current.get('benchmark')}, this harness gates version {now_version} (other figures); "
                         f"re-record it on {base_class}" + (f": {rerecord}" if rerecord else ""))
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
    # The run's grouping and gating win: the run's code states today's policy.
    return now.get("group") or base.get("group")


def _gated(now: Mapping[str, Any]) -> bool:
    return now["kind"] == "count" or bool(now.get("gated", False))


def _name(key: str) -> str:
    """The figure's name without its row: ``dense/tiny/1/speedup`` -> ``speedup``."""
    return key.rsplit("/", 1)[-1]


def _compare_one(key: str, base: Mapping[str, Any], now: Mapping[str, Any], thresholds: Thresholds) -> Finding:
    kind, before, after = base["kind"], base["value"], now["value"]
    if now["kind"] != kind:
        return Finding(key, kind, "changed", before, after)
    if kind == "count":
        return Finding(key, kind, "ok" if before == after else "changed", before, after)
    # A member of a group is judged with its group; alone it is reported.
    gated = _gated(now) and _group(base, now) is None
    change = _worsening(kind, before, after)
    if change is None:
        return Finding(key, kind, "unmeasured", before, after, gated=gated)
    if gated:
        band = thresholds.gate_band(_change_error(base, now))
    else:
        band = thresholds.band(float(now.get("spread", 0.0)), float(base.get("spread", 0.0)))
    return Finding(key, kind, _verdict(change, band, gated=gated), before, after, change, band, gated)


def _compare_group(group: str, name: str, members: Sequence[tuple[str, Mapping[str, Any], Mapping[str, Any]]],
                   thresholds: Thresholds) -> Finding:
    """The verdict of one group: the geometric mean of its figures' worsening, gated when its figures are."""
    key = f"{group}/{name}{MEAN_SUFFIX}"
    kind = members[0][1]["kind"]
    gated = all(_gated(now) for _, _, now in members)
    keys = tuple(k for k, _, _ in members)
    measured = [(b["value"], n["value"], _change_error(b, n)) for _, b, n in members
                if _worsening(kind, b["value"], n["value"]) is not None]
    if not measured:
        return Finding(key, kind, "unmeasured", None, None, gated=gated, members=keys)
    before = math.exp(sum(math.log(b) for b, _, _ in measured) / len(measured))
    now = math.exp(sum(math.log(n) for _, n, _ in measured) / len(measured))
    change = now / before - 1 if kind == "time" else before / now - 1  # the geometric mean of the ratios, minus 1
    error = math.sqrt(sum(e * e for _, _, e in measured)) / len(measured)  # of the mean of the log-ratios
    band = thresholds.gate_band(error) if gated else thresholds.reported_group_band(error)
    return Finding(key, kind, _verdict(change, band, gated=gated), before, now, change, band, gated, keys)


def compare(current: Mapping[str, Any], baseline: Mapping[str, Any], *,
            thresholds: Thresholds = Thresholds()) -> list[Finding]:
    """One :class:`Finding` per figure of either run (the baseline's order, new figures after), then one
    per group (figures sharing a group and a name), over the group's figures present in both runs."""
    check_comparable(current, baseline)
    now_figures, base_figures = current["figures"], baseline["figures"]
    findings = []
    groups: dict[tuple[str, str], list[tuple[str, Mapping[str, Any], Mapping[str, Any]]]] = {}
    for key, base in base_figures.items():
        if key not in now_figures:
            findings.append(Finding(key, base["kind"], "missing", base["value"], None))
            continue
        now = now_figures[key]
        findings.append(_compare_one(key, base, now, thresholds))
        group = _group(base, now)
        if base["kind"] == now["kind"] != "count" and group is not None:
            groups.setdefault((group, _name(key)), []).append((key, base, now))
    findings += [Finding(key, now["kind"], "new", None, now["value"])
                 for key, now in now_figures.items() if key not in base_figures]
    findings += [_compare_group(group, name, members, thresholds) for (group, name), members in groups.items()]
    return findings


def failed(findings: Sequence[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.failed]


def _suspected(finding: Finding) -> bool:
    return finding.verdict == "regression" and finding.kind != "count"


def suspects(findings: Sequence[Finding]) -> list[Finding]:
    """The failing findings that re-measuring can settle: gated times beyond their bands."""
    return [f for f in findings if _suspected(f)]


def exact_failures(findings: Sequence[Finding]) -> list[Finding]:
    """The failing findings that re-measuring cannot change: counts, figures missing from the run."""
    return [f for f in findings if f.failed and not _suspected(f)]


def confirm(findings: Sequence[Finding], baseline: Mapping[str, Any],
            remeasure: Callable[[Sequence[str]], Mapping[str, Mapping[str, Any]]], *,
            thresholds: Thresholds = Thresholds(), attempts: int = 2) -> list[Finding]:
    """``findings`` with each suspected regression (:func:`suspects`) re-measured up to ``attempts`` times:
    it stays a ``regression`` only if every re-measurement is beyond its band too, and becomes
    ``unconfirmed`` (passing) at the first within it. ``remeasure(keys)`` measures the rows of those figure
    keys again and returns their figures (as in a report's ``figures``); a key it does not return counts as
    beyond the band (the first measurement stands)."""
    pending = {index: finding for index, finding in enumerate(findings) if _suspected(finding)}
    history: dict[int, list[tuple[float | None, float | None, float | None]]] = {index: [] for index in pending}
    verdicts = {index: "regression" for index in pending}
    base_figures = baseline["figures"]
    for _ in range(attempts):
        if not pending:
            break
        keys = sorted({key for finding in pending.values() for key in (finding.members or (finding.key,))})
        fresh = remeasure(keys)
        for index, finding in list(pending.items()):
            again = _again(finding, base_figures, fresh, thresholds)
            history[index].append((again.current, again.change, again.band) if again else (None, None, None))
            if again is not None and not again.failed:
                verdicts[index] = "unconfirmed"
                del pending[index]
    return [dataclasses.replace(finding, verdict=verdicts[index], remeasured=tuple(history[index]))
            if index in verdicts else finding for index, finding in enumerate(findings)]


def _again(finding: Finding, base_figures: Mapping[str, Any], fresh: Mapping[str, Mapping[str, Any]],
           thresholds: Thresholds) -> Finding | None:
    """The finding recomputed from re-measured figures; None where they lack one of its keys."""
    keys = finding.members or (finding.key,)
    if any(key not in fresh for key in keys):
        return None
    if not finding.members:
        return _compare_one(finding.key, base_figures[finding.key], fresh[finding.key], thresholds)
    group, name = finding.key.removesuffix(MEAN_SUFFIX).rsplit("/", 1)
    return _compare_group(group, name, [(key, base_figures[key], fresh[key]) for key in keys], thresholds)


def format_findings(findings: Sequence[Finding], *, baseline_path: str, thresholds: Thresholds) -> str:
    """The verdict block: the policy, every failing, notable or re-measured finding, every group's, a summary
    line."""
    bad = failed(findings)
    gated = [f for f in findings if f.gated]
    lines = [f"baseline {baseline_path}: {len(findings)} findings, {len(gated)} gated: counts exactly; gated times "
             f"(alone or by a group's geometric mean) beyond min({thresholds.gate_cap * 100:.0f}%, "
             f"max({thresholds.gate_floor * 100:.0f}%, {thresholds.gate_z:g} standard errors)), failing only when "
             f"re-measuring confirms it; other times and speed-ups reported beyond max({thresholds.floor * 100:.0f}%, "
             f"{thresholds.noise_factor:g} x spread), never failed"]
    lines += ["  " + f.describe() for f in findings
              if f.failed or f.verdict in _REPORTED or f.key.endswith(MEAN_SUFFIX) or f.remeasured]
    noise = [f for f in findings if f.verdict == "unconfirmed"]
    tail = (f" ({len(noise)} beyond at first, within when re-measured: noise)" if noise else "")
    lines.append(f"REGRESSION: {len(bad)} of {len(gated)} gated findings" if bad
                 else f"no regression: {len(gated)} gated findings within their bands{tail}")
    return "\n".join(lines)
