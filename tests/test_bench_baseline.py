"""The baseline comparison: counts exact, gated times alone or by a group's geometric mean, the rest reported.

Oracles are closed forms: a reported figure's band is max(floor, factor x the larger spread), and a time is
beyond it exactly when now / before - 1 exceeds it (a speed-up: before / now - 1); a gated time's band is
min(cap, max(gate floor, z x standard error)), the standard error of a median of n samples with spread s
being sqrt(pi / 2) s / 1.349 / sqrt(n), the two runs' in quadrature, a group's the root of the sum of its
rows' squares over their number, held against the geometric mean of the rows' now / before. Property tests
sweep the plane of (before, after, spreads, thresholds) around the boundaries. Re-measuring a suspected
regression (confirm) is tested in tests/test_bench_confirm.py.
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.bench import BENCHMARKS, Figure, Stat, Thresholds, compare, failed, read_json
from harness.bench.baseline import check_comparable, format_findings, standard_error
from harness.bench.report import DEFAULT_GATE_VERSION, SCHEMA, Result, make_report
from harness.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
BASELINES = ROOT / "harness" / "bench" / "baselines"
ENV = {"device_class": "cuda:NVIDIA H200/cuda", "emulated": False}


def report(figures: dict[str, Figure], *, settings: dict | None = None, env: dict | None = None,
           benchmark: str = "runner") -> dict:
    result = Result(settings or {"models": ["dense"], "repeat": 30}, [], figures)
    return make_report(benchmark=benchmark, env=env or ENV, result=result, implementation="reference")


DEFAULT_THRESHOLDS = Thresholds()


def verdict(before: Figure, after: Figure, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> str:
    (finding,) = compare(report({"x": after}), report({"x": before}), thresholds=thresholds)
    return finding.verdict


# -- counts ------------------------------------------------------------------------------------


@given(before=st.integers(0, 10_000), delta=st.integers(-50, 50))
def test_counts_are_exact_in_both_directions(before, delta):
    expected = "ok" if delta == 0 else "changed"
    assert verdict(Figure.count(before), Figure.count(before + delta)) == expected


def test_one_more_launch_fails_however_loose_the_time_thresholds():
    loose = Thresholds(floor=10.0, noise_factor=100.0)
    assert verdict(Figure.count(2), Figure.count(3), loose) == "changed"
    assert verdict(Figure.count(None), Figure.count(None)) == "ok"
    assert verdict(Figure.count(0), Figure.count(None)) == "changed"


# -- times and speed-ups -------------------------------------------------------------------------

positive = st.floats(1e-3, 1e3, allow_nan=False)
spread = st.floats(0.0, 0.5, allow_nan=False)


@given(before=positive, ratio=st.floats(0.2, 5.0), spread_before=spread, spread_now=spread,
       floor=st.floats(0.0, 0.5), factor=st.floats(0.0, 5.0))
def test_time_verdict_is_the_closed_form_and_never_fails(before, ratio, spread_before, spread_now, floor, factor):
    after = before * ratio
    band = max(floor, factor * max(spread_before, spread_now))
    change = after / before - 1
    expected = "slower" if change > band else "faster" if (1 + change) * (1 + band) < 1 else "ok"
    thresholds = Thresholds(floor=floor, noise_factor=factor)
    got = verdict(Figure("time", before, spread_before, "ms"), Figure("time", after, spread_now, "ms"), thresholds)
    assert got == expected
    assert not failed(compare(report({"x": Figure("time", after, spread_now)}),
                              report({"x": Figure("time", before, spread_before)}), thresholds=thresholds))


@given(before=positive, ratio=st.floats(0.2, 5.0), noise=spread)
def test_speedup_is_the_reported_higher_better_mirror_of_time(before, ratio, noise):
    # A speed-up falling from s to s / r is beyond its band exactly as a time rising from t to t * r, and,
    # like every speed-up, it is reported, never failed.
    as_time = verdict(Figure("time", before, noise), Figure("time", before * ratio, noise))
    as_speedup = verdict(Figure("speedup", before, noise), Figure("speedup", before / ratio, noise))
    assert as_speedup == as_time and as_speedup not in {"regression", "changed", "missing"}


def test_a_speedup_cannot_be_gated():
    with pytest.raises(ValueError, match="speed-ups are reported, not gated"):
        Figure("speedup", 2.0, gated=True)


def test_noise_band_widens_with_the_noisier_run():
    quiet, noisy = Figure("time", 1.0, 0.01, "ms"), Figure("time", 1.3, 0.2, "ms")
    assert verdict(quiet, Figure("time", 1.3, 0.01, "ms")) == "slower"  # band = floor 15%
    assert verdict(quiet, noisy) == "ok"  # band = 3 x 20% = 60%
    assert verdict(Figure("time", 1.3, 0.2, "ms"), Figure("time", 1.0, 0.01, "ms")) == "ok"  # not beyond 60%
    assert verdict(Figure("time", 2.0, 0.01, "ms"), Figure("time", 1.0, 0.01, "ms")) == "faster"


def test_exactly_on_the_band_is_not_beyond_it():
    thresholds = Thresholds(gate_floor=0.25, gate_cap=0.25)
    assert verdict(Figure("time", 4.0, gated=True), Figure("time", 5.0, gated=True), thresholds) == "ok"
    assert verdict(Figure("time", 4.0, gated=True), Figure("time", 5.0 + 1e-9, gated=True), thresholds) == "regression"


# -- gated times -------------------------------------------------------------------------------------

repeats = st.integers(1, 60)


def oracle_error(spread: float, n: int) -> float:
    return spread if n < 4 else (math.pi / 2) ** 0.5 * spread / 1.349 / n ** 0.5


def test_standard_error_of_a_median():
    assert standard_error(0.2, 40) == pytest.approx(1.2533 * 0.2 / 1.349 / 40 ** 0.5, rel=1e-4)
    assert standard_error(0.2, 3) == 0.2 and standard_error(0.2, None) == 0.2  # no quartiles: the spread


@given(before=positive, ratio=st.floats(0.2, 5.0), s0=spread, s1=spread, n0=repeats, n1=repeats,
       floor=st.floats(0.0, 0.3), extra=st.floats(0.0, 0.3), z=st.floats(0.0, 5.0))
def test_gated_time_verdict_is_the_closed_form(before, ratio, s0, s1, n0, n1, floor, extra, z):
    thresholds = Thresholds(gate_floor=floor, gate_cap=floor + extra, gate_z=z)
    (finding,) = compare(report({"x": Figure("time", before * ratio, s1, "ms", gated=True, repeats=n1)}),
                         report({"x": Figure("time", before, s0, "ms", gated=True, repeats=n0)}),
                         thresholds=thresholds)
    band = min(floor + extra, max(floor, z * math.hypot(oracle_error(s0, n0), oracle_error(s1, n1))))
    assert finding.gated and finding.band == pytest.approx(band)
    change = ratio - 1
    if abs(change - band) > 1e-9 and abs((1 + change) * (1 + band) - 1) > 1e-9:  # off the boundaries
        expected = "regression" if change > band else "improved" if (1 + change) * (1 + band) < 1 else "ok"
        assert finding.verdict == expected


def test_a_noisy_run_does_not_widen_a_gated_band_past_its_cap():
    # Spreads of 90% over 5 samples: 3 standard errors are about 120%, and would let a 20% slowdown through.
    before, now = Figure("time", 1.0, 0.9, gated=True, repeats=5), Figure("time", 1.2, 0.9, gated=True, repeats=5)
    (finding,) = compare(report({"x": now}), report({"x": before}))
    assert finding.band == Thresholds().gate_cap < 0.2 and finding.verdict == "regression"


def test_thresholds_refuse_a_cap_below_the_floor():
    with pytest.raises(UsageError, match="--gate-cap 0.1 is below --gate-floor 0.2"):
        Thresholds(gate_floor=0.2, gate_cap=0.1)


# -- groups -------------------------------------------------------------------------------------------

rows_of_a_group = st.lists(st.tuples(positive, st.floats(0.2, 5.0), spread, spread), min_size=1, max_size=6)


@given(rows=rows_of_a_group, n=repeats, floor=st.floats(0.0, 0.3), extra=st.floats(0.0, 0.3),
       z=st.floats(0.0, 4.0))
def test_gated_group_verdict_is_the_closed_form_and_rows_are_reported_only(rows, n, floor, extra, z):
    before = {f"m/{i}/host": Figure("time", b, s0, "x", "m", True, n) for i, (b, _, s0, _) in enumerate(rows)}
    now = {f"m/{i}/host": Figure("time", b * r, s1, "x", "m", True, n) for i, (b, r, _, s1) in enumerate(rows)}
    thresholds = Thresholds(gate_floor=floor, gate_cap=floor + extra, gate_z=z)
    findings = compare(report(now), report(before), thresholds=thresholds)
    *singles, group = findings
    assert group.key == "m/host (geometric mean)" and group.members == tuple(before)
    assert all(not f.failed and not f.gated for f in singles)
    # Oracle: the geometric mean of the rows' now / before = of r, and the standard error of its mean.
    mean = 1.0
    for _, r, _, _ in rows:
        mean *= r ** (1 / len(rows))
    error = sum(oracle_error(s0, n) ** 2 + oracle_error(s1, n) ** 2 for _, _, s0, s1 in rows) ** 0.5 / len(rows)
    band = min(floor + extra, max(floor, z * error))
    assert group.band == pytest.approx(band) and group.change == pytest.approx(mean - 1)
    if abs(mean - 1 - band) > 1e-9 and abs(mean * (1 + band) - 1) > 1e-9:  # off the boundaries
        expected = "regression" if mean - 1 > band else "improved" if mean * (1 + band) < 1 else "ok"
        assert group.verdict == expected
        assert failed(findings) == ([group] if expected == "regression" else [])


@given(rows=rows_of_a_group)
def test_a_speedup_group_is_reported_never_failed(rows):
    before = {f"m/{i}/speedup": Figure.speedup(Stat(b, s0, 15), group="m") for i, (b, _, s0, _) in enumerate(rows)}
    now = {f"m/{i}/speedup": Figure.speedup(Stat(b / r, s1, 15), group="m") for i, (b, r, _, s1) in enumerate(rows)}
    findings = compare(report(now), report(before))
    assert not failed(findings) and findings[-1].key == "m/speedup (geometric mean)" and not findings[-1].gated


def test_a_group_compares_the_rows_both_runs_have_and_one_bad_row_is_diluted():
    def host(value: float) -> Figure:
        return Figure("time", value, 0.0, "x", "m", True, 40)

    before = report({f"m/{b}/host": host(1.0) for b in "abcd"})
    now = report({"m/a/host": host(1.5), **{f"m/{b}/host": host(1.0) for b in "bcd"}})
    findings = {f.key: f for f in compare(now, before)}
    assert findings["m/a/host"].verdict == "slower"  # one row 50% slower: reported
    assert findings["m/host (geometric mean)"].verdict == "ok"  # mean 1.5 ** (1/4) - 1 = 10.7% < 12%
    now["figures"]["m/b/host"]["value"] = 1.5  # two rows: 22.5% slower
    assert failed(compare(now, before))[0].key == "m/host (geometric mean)"


def test_groups_are_per_figure_name_and_a_baseline_without_groups_is_read_with_the_runs():
    before = report({"m/a/host": Figure("time", 1.0, gated=True), "m/a/speedup": Figure("speedup", 4.0)})
    now = report({"m/a/host": Figure("time", 2.0, group="m", gated=True),
                  "m/a/speedup": Figure("speedup", 1.0, group="m")})
    findings = {f.key: f.verdict for f in compare(now, before)}
    assert findings == {"m/a/host": "slower", "m/a/speedup": "slower", "m/host (geometric mean)": "regression",
                        "m/speedup (geometric mean)": "slower"}


def test_improvements_and_new_figures_pass_missing_ones_fail():
    before = report({"a": Figure.count(1), "b": Figure("time", 2.0, 0.0)})
    now = report({"b": Figure("time", 1.0, 0.0), "c": Figure.count(5)})
    findings = {f.key: f for f in compare(now, before)}
    assert [findings[k].verdict for k in "abc"] == ["missing", "faster", "new"]
    assert [f.key for f in failed(list(findings.values()))] == ["a"]


def test_a_time_without_a_ratio_is_unmeasured_not_a_verdict():
    for before, after in ((0.0, 0.4), (0.4, 0.0), (None, 1.0), (1.0, None), (0.0, 0.0)):
        assert verdict(Figure("time", before, 0.0), Figure("time", after, 0.0)) == "unmeasured"
    assert not failed(compare(report({"x": Figure("time", 0.0)}), report({"x": Figure("time", 2.0)})))


def test_a_kind_change_is_a_finding():
    assert verdict(Figure.count(3), Figure("time", 3.0)) == "changed"


# -- comparability -----------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "message"), [
    ({"benchmark": "gather"}, "is a 'runner' report, this run is 'gather'"),
    ({"env": {"device_class": "cpu/emulated", "emulated": True}}, "measured on 'cuda:NVIDIA H200/cuda'"),
    ({"settings": {"models": ["moe"], "repeat": 30}}, "models: baseline ['dense'], now ['moe']"),
])
def test_incomparable_runs_are_usage_errors(change, message):
    baseline = report({"x": Figure.count(1)})
    now = report({"x": Figure.count(1)}, **change)
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        compare(now, baseline)


def test_a_baseline_of_another_gate_version_is_a_usage_error_naming_the_command_that_records_it():
    baseline = report({"x": Figure.count(1)})
    del baseline["gate_version"]  # written before the field existed: version 1
    now = report({"x": Figure.count(1)})
    now["gate_version"] = 2
    with pytest.raises(UsageError) as refused:
        check_comparable(now, baseline, rerecord="python -m harness bench runner --record-baseline b.json")
    message = str(refused.value)
    assert "\n" not in message and "gate version 1 of bench runner, this harness gates version 2" in message
    assert message.endswith("re-record it on cuda:NVIDIA H200/cuda: python -m harness bench runner "
                            "--record-baseline b.json")


def test_repeat_and_implementation_may_differ():
    baseline = report({"x": Figure.count(1)}, settings={"models": ["dense"], "repeat": 50})
    now = report({"x": Figure.count(1)}, settings={"models": ["dense"], "repeat": 5})
    now["implementation"] = "harness.bench.variants:SlowedRunner"
    assert [f.verdict for f in compare(now, baseline)] == ["ok"]


def test_stat_spread_is_interquartile_range_over_median():
    stat = Stat.of([1.0, 2.0, 3.0, 4.0, 5.0])
    assert stat.median == 3.0 and stat.spread == pytest.approx((4.0 - 2.0) / 3.0)
    assert Stat.of([2.0, 4.0]).spread == pytest.approx(2.0 / 3.0)  # few samples: full range
    ratio = Stat(2.0, 0.03, 10).ratio_to(Stat(6.0, 0.04, 10))
    assert ratio.median == 3.0 and ratio.spread == pytest.approx(0.05)


def test_format_names_every_failing_figure_and_its_band():
    before = report({"dense/1/run_ms": Figure("time", 1.0, 0.01, "ms"), "dense/1/launches_run": Figure.count(1)})
    now = report({"dense/1/run_ms": Figure("time", 3.0, 0.01, "ms"), "dense/1/launches_run": Figure.count(40)})
    text = format_findings(compare(now, before), baseline_path="b.json", thresholds=Thresholds())
    assert "slower     dense/1/run_ms: 1 -> 3 (+200.0% worse, noise band 15.0%; reported, not gated)" in text
    assert "changed    dense/1/launches_run: 1 -> 40 (counts must match exactly)" in text
    faster = format_findings(compare(before, now), baseline_path="b.json", thresholds=Thresholds())
    assert "faster     dense/1/run_ms: 3 -> 1 (66.7% better, noise band 15.0%; reported, not gated)" in faster
    assert text.splitlines()[-1] == "REGRESSION: 1 of 1 gated findings"


# -- files -------------------------------------------------------------------------------------


def test_bad_baseline_files_are_one_line_errors(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        read_json(tmp_path / "absent.json")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(UsageError, match="not a readable JSON report"):
        read_json(tmp_path / "junk.json")
    (tmp_path / "other.json").write_text(json.dumps({"schema": SCHEMA + 1}))
    with pytest.raises(UsageError, match="not a benchmark report"):
        read_json(tmp_path / "other.json")


@pytest.mark.parametrize("path", sorted(BASELINES.glob("*.json")), ids=lambda p: p.name)
def test_committed_baselines_are_readable_and_pass_against_themselves(path):
    baseline = read_json(path)
    module = importlib.import_module(BENCHMARKS[baseline["benchmark"]])
    version = getattr(module, "GATE_VERSION", DEFAULT_GATE_VERSION)
    if baseline.get("gate_version", DEFAULT_GATE_VERSION) != version:
        # Recorded on a device this machine is not (the H200): refused until re-recorded there.
        assert not baseline["environment"]["emulated"], f"{path.name}: re-record it (emulated: on this machine)"
        run = {**copy.deepcopy(baseline), "gate_version": version}  # what a run of this harness writes
        with pytest.raises(UsageError, match=f"this harness gates version {version}"):
            compare(run, baseline)
        pytest.xfail(f"{path.name} holds gate version {baseline.get('gate_version', DEFAULT_GATE_VERSION)}: "
                     "re-record it on its device")
    findings = compare(copy.deepcopy(baseline), baseline)
    assert findings and not failed(findings)
    if baseline["environment"]["emulated"]:  # the emulation makes no speed claim
        assert {f["kind"] for f in baseline["figures"].values()} == {"count"}


def test_cli_reports_a_bad_baseline_in_one_line(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "harness", "bench", "runner", "--device", "cpu",
                                "--baseline", str(tmp_path / "absent.json")],
                               cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 2
    assert "baseline" in completed.stderr and "no such file" in completed.stderr
    assert "Traceback" not in completed.stderr


def test_difference_spread_is_relative_to_the_difference():
    from harness.bench.gather import _difference

    total, part = Stat(30.0, 0.02, 20), Stat(20.0, 0.03, 20)  # absolute spreads 0.6 and 0.6
    difference = _difference(total, part)
    assert difference.median == 10.0
    assert difference.spread == pytest.approx((0.6 ** 2 + 0.6 ** 2) ** 0.5 / 10.0)
    assert _difference(part, total).median == 0.0 and _difference(part, total).spread == 0.0
