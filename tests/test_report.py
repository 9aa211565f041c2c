"""The run report: per-component outcomes, errors per dtype against the tolerance table (merged across
xdist workers), goldens, JSON output, Markdown and failure annotations."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from harness import observations
from harness.compare import assert_equivalent, tolerance_for
from harness.plugin.report import _WithoutBanner, annotations, format_markdown

pytest_plugins = ["pytester"]


def test_a_tolerance_comparison_records_its_error_and_share_of_the_tolerance():
    observations.reset()
    expected = torch.tensor([1.0, -2.0], dtype=torch.float32)
    assert_equivalent(expected + torch.tensor([4e-6, 0.0]), expected, exact=False)
    entry = observations.snapshot()["errors"]["float32"]
    tol = tolerance_for(torch.float32)
    # closed form: |diff| / (atol + rtol * |expected|) at the first element
    assert abs(entry["max_abs_error"] - 4e-6) < 1e-7
    assert abs(entry["tolerance_used"] - 4e-6 / (tol.atol + tol.rtol * 1.0)) < 1e-2
    assert_equivalent(expected, expected, exact=True)  # bitwise comparisons are not tolerance uses
    # A failing comparison reports itself; the run report shows how close passing ones came.
    with contextlib.suppress(AssertionError):
        assert_equivalent(expected + 1.0, expected, exact=False)
    assert observations.snapshot()["errors"]["float32"]["comparisons"] == 1


def test_merge_takes_maxima_and_sums_counts():
    one = {"errors": {"bfloat16": {"max_abs_error": 0.1, "tolerance_used": 0.5, "comparisons": 2}},
           "counters": {"runner.replays": 3}}
    two = {"errors": {"bfloat16": {"max_abs_error": 0.05, "tolerance_used": 0.9, "comparisons": 1}},
           "counters": {"runner.replays": 4, "runner.eager_fallbacks": 1}}
    merged = observations.merge([one, two])
    assert merged["errors"]["bfloat16"] == {"max_abs_error": 0.1, "tolerance_used": 0.9, "comparisons": 3}
    assert merged["counters"] == {"runner.replays": 7, "runner.eager_fallbacks": 1}


_SUITE = '''
import torch
from harness.compare import assert_equivalent
from harness import observations

def test_close():
    expected = torch.ones(3, dtype=torch.bfloat16)
    assert_equivalent(expected * 1.0078125, expected, exact=False)
    observations.count("runner.replays")

def test_broken():
    assert 1 == 2, "on purpose"
'''


@pytest.mark.long_running
def test_report_is_written_as_json_and_merged_across_xdist_workers(pytester):
    pytester.makeconftest('pytest_plugins = ["harness.plugin.report"]\n')
    pytester.mkdir("suites")
    pytester.mkdir("suites/demo")
    (pytester.path / "suites/demo/test_demo.py").write_text(_SUITE)
    result = pytester.runpytest_subprocess("suites", "-n", "2", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                                           "--harness-report=out/report.json", "--junitxml", "out/junit.xml")
    result.stdout.fnmatch_lines(["*harness run report*", "*demo*1 passed, 1 failed*",
                                 "*largest bfloat16 error 0.00781*"])
    report = json.loads((pytester.path / "out/report.json").read_text())
    assert report["outcomes"] == {"demo": {"passed": 1, "failed": 1}}
    assert report["failed"] == ["suites/demo/test_demo.py::test_broken"]
    assert report["setup"]["hypothesis_profile"] in ("dev", "ci", "default")
    assert report["counters"] == {"runner.replays": 1}
    assert report["errors"]["bfloat16"]["comparisons"] == 1
    assert report["exit_status"] == 1
    lines = annotations(str(pytester.path / "out/junit.xml"))
    assert len(lines) == 1 and lines[0].startswith("::error file=suites/demo/test_demo.py,line=11,title=test_broken::")
    markdown = format_markdown(report)
    assert "| demo | 1 | 1 | 0 | 0 |" in markdown


class _SyrupyReport:
    """Stands in for syrupy's session report: only its ``lines`` are read."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = iter(lines)


@pytest.mark.parametrize("colour", [("", ""), ("\x1b[33m", "\x1b[0m")], ids=["plain", "coloured"])
def test_syrupy_5s_unused_count_and_delete_advice_are_dropped(colour):
    # syrupy 5 cannot switch its unused rule off: the goldens of other devices and torch minors read as unused,
    # and its advice (--snapshot-update) would delete them; the harness's orphan rule replaces both.
    on, off = colour
    syrupy_5 = [f"{on}11{off} snapshots passed. {on}2{off} snapshots unused.", "",
                f"{on}Unused{off} test_a (golden/x.ambr)",
                f"{on}Re-run pytest with --snapshot-update to delete unused snapshots.{off}"]
    assert list(_WithoutBanner(_SyrupyReport(syrupy_5)).lines) == [f"{on}11{off} snapshots passed."]
    only_unused = [f"{on}1{off} snapshot unused.", "", "Re-run pytest with --snapshot-update to delete unused "
                                                       "snapshots."]
    assert list(_WithoutBanner(_SyrupyReport(only_unused)).lines) == []


def test_syrupys_disabled_rule_banner_is_dropped_and_the_rest_kept():
    syrupy_7 = ["Unused snapshot detection is disabled (--snapshot-disable-unused). This is not recommended.",
                "3 snapshots passed. 1 snapshot generated."]
    assert list(_WithoutBanner(_SyrupyReport(syrupy_7)).lines) == ["3 snapshots passed. 1 snapshot generated."]


def test_an_interrupted_run_says_so(pytester: pytest.Pytester):
    """A run stopped by Ctrl-C reports what finished, and says that it is not the whole run."""
    pytester.makepyfile(test_stop="""
def test_first(device):
    pass


def test_interrupted():
    raise KeyboardInterrupt


def test_never_reached():
    pass
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--device", "cpu")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    output = result.stdout.str()
    assert "harness run report" in output
    assert "interrupted: the run stopped before its end" in output
