"""Confirming a suspected regression by re-measuring it before failing (harness.bench.baseline.confirm).

Synthetic figures of one model, as the runner benchmark writes them: two rows' runner host overhead
relative to the host reference (gated by the model's geometric mean) and a segment GPU time (gated alone).
The oracle is the policy itself: a gated time beyond its band is re-measured up to N times, fails only if
every re-measurement is beyond its band too, and passes, marked ``unconfirmed``, at the first within it;
counts fail at once and are never re-measured. The end-to-end tests run ``python -m harness bench`` in this
process with a stand-in benchmark whose measurements are scripted, so the command's output and exit status
are checked without a GPU.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from harness.bench import command
from harness.bench.baseline import Thresholds, compare, confirm, failed, format_findings, suspects
from harness.bench.report import Figure, Result, make_report

ENV = {"device_class": "cuda:NVIDIA H200/cuda", "emulated": False}
MODEL = "dense/large"
BATCHES = ("1", "8+8+8+7")
HOST = [f"{MODEL}/{batch}/runner_host_ratio" for batch in BATCHES]
SEGMENTS = f"{MODEL}/1/segments_gpu_ms"
GROUP = f"{MODEL}/runner_host_ratio (geometric mean)"


def figures(host: Sequence[float], *, segments: float = 1.2, launches: int = 119, spread: float = 0.1,
            repeats: int = 40) -> dict[str, Figure]:
    found = {key: Figure("time", value, spread, "x", MODEL, True, repeats) for key, value in zip(HOST, host)}
    found[SEGMENTS] = Figure("time", segments, 0.01, "ms", None, True, repeats)
    found[f"{MODEL}/1/launches_run"] = Figure.count(launches)
    return found


def report(found: dict[str, Figure]) -> dict:
    result = Result({"models": ["dense"]}, [], found)
    return make_report(benchmark="runner", env=ENV, result=result, implementation="reference", gate_version=2)


BASELINE = report(figures([1.0, 1.0]))


class Scripted:
    """A re-measurement that hands back the next scripted host ratios (and segment time) and records its calls."""

    def __init__(self, *host: Sequence[float], segments: float = 1.2) -> None:
        self.script = list(host)
        self.segments = segments
        self.calls: list[list[str]] = []

    def __call__(self, keys: Sequence[str]) -> dict[str, dict]:
        self.calls.append(list(keys))
        fresh = report(figures(self.script.pop(0), segments=self.segments))["figures"]
        return {key: fresh[key] for key in keys}


def never(keys: Sequence[str]) -> dict:
    raise AssertionError(f"re-measured {keys}")


def by_key(findings) -> dict:
    return {f.key: f for f in findings}


def test_noise_within_the_band_passes_without_re_measuring():
    findings = compare(report(figures([1.06, 0.95], segments=1.25)), BASELINE)
    assert not suspects(findings) and not failed(findings)
    assert confirm(findings, BASELINE, never) == findings
    assert by_key(findings)[GROUP].change == pytest.approx((1.06 * 0.95) ** 0.5 - 1)


def test_a_20_percent_slower_host_path_fails_after_confirmation():
    remeasure = Scripted([1.21, 1.19], [1.2, 1.22])
    findings = confirm(compare(report(figures([1.2, 1.2])), BASELINE), BASELINE, remeasure, attempts=2)
    group = by_key(findings)[GROUP]
    assert group.verdict == "regression" and group.failed
    assert remeasure.calls == [HOST, HOST]  # the model's rows, twice: both re-measurements beyond the band
    assert [round(change, 4) for _, change, _ in group.remeasured] == [
        round((1.21 * 1.19) ** 0.5 - 1, 4), round((1.2 * 1.22) ** 0.5 - 1, 4)]
    text = format_findings(findings, baseline_path="b.json", thresholds=Thresholds())
    line = next(line for line in text.splitlines() if GROUP in line)
    # the first measurement and each confirming one, with their bands
    assert line.startswith(f"  regression {GROUP}: 1 -> 1.2 (+20.0% worse, noise band 12.0%); re-measured: 1.2 (")
    assert line.endswith("beyond its band every time, confirmed")
    assert text.splitlines()[-1] == "REGRESSION: 1 of 3 gated findings"


def test_one_noisy_outlier_that_re_measuring_does_not_repeat_passes():
    remeasure = Scripted([1.01, 0.99])
    first = compare(report(figures([1.45, 1.02])), BASELINE)  # one row 45% slower: the model's mean 21.6%
    assert [f.key for f in failed(first)] == [GROUP]
    findings = confirm(first, BASELINE, remeasure, attempts=2)
    group = by_key(findings)[GROUP]
    assert group.verdict == "unconfirmed" and not failed(findings)
    assert len(remeasure.calls) == 1  # within at the first re-measurement: no second
    text = format_findings(findings, baseline_path="b.json", thresholds=Thresholds())
    assert (f"  unconfirmed {GROUP}: 1 -> 1.216 (+21.6% worse, noise band 12.0%); re-measured: 0.9999 "
            "(0.0% better, band 12.0%): within its band, so the first measurement was noise; not failed") in text
    assert text.splitlines()[-1] == ("no regression: 3 gated findings within their bands "
                                     "(1 beyond at first, within when re-measured: noise)")


def test_an_outlier_repeated_once_is_settled_by_the_second_re_measurement():
    remeasure = Scripted([1.3, 1.2], [1.0, 1.03])
    findings = confirm(compare(report(figures([1.3, 1.2])), BASELINE), BASELINE, remeasure, attempts=2)
    group = by_key(findings)[GROUP]
    assert group.verdict == "unconfirmed" and len(group.remeasured) == 2


def test_a_single_gated_figure_is_re_measured_alone_and_counts_never_are():
    remeasure = Scripted([1.0, 1.0], [1.0, 1.0], segments=1.5)
    first = compare(report(figures([1.0, 1.0], segments=1.5, launches=120)), BASELINE)
    assert {f.key: f.verdict for f in failed(first)} == {SEGMENTS: "regression", f"{MODEL}/1/launches_run": "changed"}
    findings = confirm(first, BASELINE, remeasure, attempts=2)
    assert remeasure.calls == [[SEGMENTS], [SEGMENTS]]
    assert by_key(findings)[f"{MODEL}/1/launches_run"].remeasured == ()
    assert by_key(findings)[SEGMENTS].verdict == "regression"


def test_what_a_re_measurement_does_not_return_keeps_the_first_measurement():
    findings = confirm(compare(report(figures([1.3, 1.3])), BASELINE), BASELINE, lambda keys: {}, attempts=1)
    group = by_key(findings)[GROUP]
    assert group.verdict == "regression" and group.remeasured == ((None, None, None),)
    assert "re-measured: absent (not re-measurable): beyond its band every time, confirmed" in group.describe()


def test_no_attempts_fail_at_once():
    first = compare(report(figures([1.3, 1.3])), BASELINE)
    assert confirm(first, BASELINE, never, attempts=0) == first


@given(first=st.floats(1.0, 2.0), again=st.lists(st.floats(0.8, 1.6), min_size=0, max_size=4),
       attempts=st.integers(0, 4))
def test_a_suspect_fails_exactly_when_every_re_measurement_is_beyond_its_band(first, again, attempts):
    band = Thresholds().gate_floor  # spreads of 0: every band is the floor
    assume(all(abs(value - 1 - band) > 1e-9 for value in [first, *again]))  # off the boundary
    base = report(figures([1.0, 1.0], spread=0.0))
    script = [[value, value] for value in again] + [[first, first]] * attempts  # repeats the first when run out

    def remeasure(keys):
        fresh = report(figures(script.pop(0), spread=0.0))["figures"]
        return {key: fresh[key] for key in keys}

    findings = confirm(compare(report(figures([first, first], spread=0.0)), base), base, remeasure, attempts=attempts)
    group = by_key(findings)[GROUP]
    if first - 1 <= band + 1e-12:
        assert group.verdict in {"ok", "improved"} and not group.remeasured
        return
    values = (again + [first] * attempts)[:attempts]
    settled = next((i for i, value in enumerate(values) if value - 1 <= band), None)
    if settled is None:
        assert group.verdict == "regression" and len(group.remeasured) == attempts
    else:
        assert group.verdict == "unconfirmed" and len(group.remeasured) == settled + 1


# -- the command, end to end, with a stand-in benchmark ---------------------------------------------


@pytest.fixture
def stand_in(monkeypatch):
    """``python -m harness bench fake``: a benchmark whose first measurement and re-measurements are scripted."""
    module = types.ModuleType("fake_bench")
    module.__doc__ = "A stand-in benchmark (scripted figures)."
    module.DESCRIPTION = module.__doc__
    module.COMPONENTS = ("runner",)
    module.GATE_VERSION = 2
    module.script = {"first": ([1.0, 1.0], 119), "again": [], "remeasured": []}
    module.add_options = lambda parser: None
    module.settings_of = lambda options, device: {"models": ["dense"]}
    module.arguments_for = lambda recorded: []
    module.format_table = lambda result, device: "(the stand-in's table)"

    def remeasure(keys):
        module.script["remeasured"].append(list(keys))
        fresh = figures(module.script["again"].pop(0))
        return {key: fresh[key] for key in keys}

    def run(options, *, device, backend, implementations, repeat):
        host, launches = module.script["first"]
        return Result({"models": ["dense"]}, [], figures(host, launches=launches), remeasure=remeasure)

    module.run = run
    monkeypatch.setitem(sys.modules, "fake_bench", module)
    monkeypatch.setitem(command.BENCHMARKS, "fake", "fake_bench")
    return module


def bench(capsys, *arguments: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = command.main(["fake", "--device", "cpu", *arguments])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture
def recorded(stand_in, capsys, tmp_path) -> str:
    path = tmp_path / "fake.json"
    status, out, err = bench(capsys, "--record-baseline", str(path))
    assert status == 0, out + err
    assert json.loads(path.read_text())["gate_version"] == 2
    return str(path)


def test_the_command_passes_an_outlier_that_re_measuring_does_not_repeat(stand_in, recorded, capsys):
    stand_in.script.update(first=([1.45, 1.02], 119), again=[[1.0, 1.01]])
    status, out, err = bench(capsys, "--baseline", recorded)
    assert status == 0, out + err
    assert f"re-measuring 1 gated time(s) beyond their bands, up to 2 time(s): {GROUP}" in out
    assert f"unconfirmed {GROUP}: 1 -> 1.216 (+21.6% worse, noise band 12.0%); re-measured: 1.005" in out
    assert stand_in.script["remeasured"] == [HOST]


def test_the_command_fails_a_20_percent_slower_host_path_after_confirming_it(stand_in, recorded, capsys):
    stand_in.script.update(first=([1.2, 1.2], 119), again=[[1.19, 1.22], [1.21, 1.2]])
    status, out, err = bench(capsys, "--baseline", recorded)
    assert status == 1, out + err
    assert f"regression {GROUP}: 1 -> 1.2 (+20.0% worse, noise band 12.0%); re-measured: 1.205" in out
    assert "confirmed" in out and out.splitlines()[-1] == "REGRESSION: 1 of 3 gated findings"
    assert stand_in.script["remeasured"] == [HOST, HOST]


def test_the_command_does_not_re_measure_a_run_that_fails_on_counts(stand_in, recorded, capsys):
    stand_in.script.update(first=([1.3, 1.3], 120))
    status, out, err = bench(capsys, "--baseline", recorded, "--confirm", "3")
    assert status == 1 and stand_in.script["remeasured"] == []
    assert ("not re-measuring 1 gated time(s) beyond their bands: 1 finding(s) fail exactly (counts or missing "
            "figures), which re-measuring cannot change") in out


def test_a_baseline_of_the_previous_gate_version_is_one_line_naming_the_command_to_record_it(stand_in, recorded,
                                                                                             capsys, tmp_path):
    old = json.loads(Path(recorded).read_text())
    del old["gate_version"]  # written before gate versions: version 1
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    stand_in.run = lambda *args, **kwargs: pytest.fail("measured before refusing")
    status, out, err = bench(capsys, "--baseline", str(path))
    assert status == 2 and out == ""
    (line,) = err.splitlines()
    assert line == ("error: the baseline holds the figures of gate version 1 of bench fake, this harness gates "
                    "version 2 (other figures); re-record it on cpu/emulated: python -m harness bench fake --device "
                    f"cpu --graph-backend emulated --record-baseline {path}")


def test_bad_confirmation_options_are_one_line(stand_in, capsys):
    status, _, err = bench(capsys, "--confirm", "-1")
    assert status == 2 and err.strip() == "error: --confirm -1: the number of re-measurements is 0 or more"
    status, _, err = bench(capsys, "--gate-floor", "0.3")
    assert status == 2 and err.strip() == ("error: --gate-cap 0.15 is below --gate-floor 0.3: the band of a gated "
                                           "figure is at least the floor and at most the cap")
