"""Golden files: readable JSON, exact for plain data, tolerance-aware for tensors, rounded to what the
tolerance can tell apart, digests per device class, never rewritten within tolerance, orphans and
corrupted files reported by name."""

from __future__ import annotations

import json
import re

# pytester's in-process runs restore sys.modules after each test, and the harness imports hypothesis when a run
# activates it: imported here, outside those runs, hypothesis keeps one module for the whole session (as in any
# test process whose own modules use it), not one per in-process run.
import hypothesis  # noqa: F401
import pytest
import torch
from syrupy.filters import props
from syrupy.matchers import path_type

from harness.golden import GoldenExtension, golden_matches, merge_golden, to_golden

pytest_plugins = ["pytester"]


def _tensor(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_golden_is_json_text_without_pickles():
    text = GoldenExtension().serialize({"plan": {"buckets": [4, 8]}, "logits": _tensor()})
    data = json.loads(text)
    assert data["plan"] == {"buckets": [4, 8]}
    assert data["logits"]["__tensor__"]["shape"] == [4, 6]
    assert "pickle" not in text and "\\x80" not in text


def test_tensor_within_its_dtype_tolerance_matches():
    base = _tensor()
    assert golden_matches(to_golden(base + 1e-7), to_golden(base))


@pytest.mark.parametrize(
    "changed",
    [
        lambda t: t + 1e-3,                       # beyond float32's tolerance
        lambda t: t.flip(0),                      # same statistics, permuted values
        lambda t: t.to(torch.float64),            # dtype changed
        lambda t: t.reshape(6, 4),                # shape changed
    ],
    ids=["shifted", "permuted", "dtype", "shape"],
)
def test_changed_tensor_does_not_match(changed):
    base = _tensor()
    assert not golden_matches(to_golden(changed(base)), to_golden(base))


def test_plain_data_is_exact():
    assert golden_matches(to_golden({"segments": 3}), to_golden({"segments": 3}))
    assert not golden_matches(to_golden({"segments": 3}), to_golden({"segments": 4}))
    assert not golden_matches(to_golden({"segments": 3}), to_golden({"segments": 3, "breaks": 2}))


def test_unknown_objects_are_refused_rather_than_pickled():
    with pytest.raises(TypeError, match="cannot store"):
        to_golden(object())


@pytest.mark.parametrize("dtype, digits", [(torch.float32, 6), (torch.bfloat16, 3), (torch.float16, 4)])
def test_values_are_rounded_to_what_the_tolerance_tells_apart(dtype, digits):
    # The churn: the same value computed at two thread counts, 6e-8 apart in float32.
    pair = torch.tensor([-0.3377763628959656, -0.33777642250061035], dtype=torch.float64).to(dtype)
    first, second = (to_golden(pair[i:i + 1])["__tensor__"] for i in range(2))
    assert first["head"] == second["head"] and first["stats"] == second["stats"]
    # Decimal places: a tenth of the tolerance at this magnitude (closed form from the tolerance table).
    assert len(repr(first["head"][0]).split(".")[1]) <= digits


def test_integer_tensors_are_stored_exactly():
    summary = to_golden(torch.tensor([123456789, -7]))["__tensor__"]
    assert summary["head"] == [123456789.0, -7.0]


def test_digest_is_per_device_class_and_merge_keeps_numbers_within_tolerance():
    base = _tensor()
    old = to_golden(base)
    moved = json.loads(json.dumps(old))
    (own_class,) = old["__tensor__"]["sha256"]  # this run's device class: cpu, or cuda-sm90 on an H200
    moved["__tensor__"]["sha256"] = {"other-class": "feed"}
    moved["__tensor__"]["stats"]["mean"] += 1e-7  # within tolerance: the old numbers stay
    merged = merge_golden(moved, old)
    assert merged["__tensor__"]["stats"] == old["__tensor__"]["stats"]
    assert merged["__tensor__"]["sha256"] == {own_class: old["__tensor__"]["sha256"][own_class], "other-class": "feed"}
    changed = to_golden(base + 1.0)
    assert merge_golden(changed, old) == changed  # beyond tolerance: new numbers, only this class's digest


def test_syrupy_exclude_and_matcher_hooks_are_honoured():
    text = GoldenExtension().serialize({"seed": 3, "took_seconds": 1.23, "plan": {"id": object()}},
                                       exclude=props("took_seconds"),
                                       matcher=path_type({"plan.id": (object,)}))
    data = json.loads(text)
    assert "took_seconds" not in data and data["seed"] == 3
    assert data["plan"]["id"] == "object"


_SUITE = '''
import torch
import pytest

@pytest.mark.parametrize("shift", [0.0])
def test_logits(snapshot, shift):
    torch.manual_seed(0)
    assert {"logits": torch.randn(4, 5) + shift, "plan": {"segments": 3}} == snapshot
'''


@pytest.fixture
def project(golden_project):
    return golden_project(_SUITE)


def _golden_files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted((root / "golden").rglob("*.json"))}


def test_update_on_an_unchanged_tree_changes_no_file(project):
    project.runpytest("--snapshot-update", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    first = _golden_files(project.path)
    assert list(first) == ["golden/demo/test_demo/test_logits[0.0].json"]
    project.runpytest("--snapshot-update", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert _golden_files(project.path) == first
    project.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_moved_bits_within_tolerance_are_reported_not_rewritten(project, rewrite_module):
    project.runpytest("--snapshot-update", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    suite = project.path / "suites/demo/test_demo.py"
    rewrite_module(suite, _SUITE.replace("[0.0]", "[1e-7]"))
    path = project.path / "golden/demo/test_demo/test_logits[0.0].json"
    path.rename(path.with_name("test_logits[1e-07].json"))
    before = _golden_files(project.path)
    result = project.runpytest("--snapshot-update", "-p", "no:cacheprovider", "--harness-report=report.json")
    result.assert_outcomes(passed=1)
    assert _golden_files(project.path) == before
    report = json.loads((project.path / "report.json").read_text())
    assert [(e["where"], e["kind"]) for e in report["goldens"]["drift"]] == [("logits", "bits changed within "
                                                                                        "tolerance")]
    result.stdout.fnmatch_lines(["*test_logits?1e-07?.json logits: bits changed within tolerance (cpu)*"])


def test_a_changed_result_shows_a_readable_diff(project, rewrite_module):
    project.runpytest("--snapshot-update", "-p", "no:cacheprovider")
    suite = project.path / "suites/demo/test_demo.py"
    rewrite_module(suite, _SUITE.replace('"segments": 3', '"segments": 4'))
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(['*"segments": 4*'])


@pytest.mark.parametrize("path_argument", [[], ["suites/demo"]], ids=["bare", "folder"])
def test_orphaned_golden_fails_the_run_also_for_a_given_folder(project, path_argument):
    project.runpytest("--snapshot-update", "-p", "no:cacheprovider")
    orphan = project.path / "golden/demo/test_removed/test_gone.json"
    orphan.parent.mkdir(parents=True)
    orphan.write_text("{}\n")
    stale = project.path / "golden/demo/test_demo/test_renamed.json"
    stale.write_text("{}\n")
    other_tool = project.path / "golden/selfcheck/kill_matrix.json"  # written by selfcheck, not a snapshot
    other_tool.parent.mkdir(parents=True)
    other_tool.write_text("{}\n")
    result = project.runpytest("-p", "no:cacheprovider", *path_argument)
    assert result.ret == 1
    assert "kill_matrix" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*ORPHANED golden golden/demo/test_demo/test_renamed.json*",
                                 "*ORPHANED golden golden/demo/test_removed/test_gone.json*"])
    # the run's last line says why it failed, not only what passed
    assert re.search(r"\b2 orphaned goldens\b", result.stdout.lines[-1]), result.stdout.lines[-1]
    project.runpytest("-p", "no:cacheprovider", "--snapshot-update", *path_argument)
    assert not orphan.exists() and not stale.exists() and other_tool.exists()


def test_a_deselected_test_still_owns_its_golden(project):
    project.runpytest("--snapshot-update", "-p", "no:cacheprovider")
    result = project.runpytest("-p", "no:cacheprovider", "suites/demo", "-k", "nothing_matches")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


@pytest.mark.parametrize("content", ['{"logits": {"__tensor__"', ""], ids=["truncated", "empty"])
def test_corrupted_golden_fails_naming_the_file(project, content):
    project.runpytest("--snapshot-update", "-p", "no:cacheprovider")
    (project.path / "golden/demo/test_demo/test_logits[0.0].json").write_text(content)
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*golden file *golden/demo/test_demo/test_logits[[]0.0[]].json is not valid JSON*"])
