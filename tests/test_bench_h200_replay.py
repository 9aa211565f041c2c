"""The baseline policy replayed on the reports of the first H200 run (tests/data/h200-run1/).

That run (torch 2.11, ``--repeat 15``, the full runner table) is the only GPU data the policy was
chosen from: a rerun against its own baseline must pass, the slowed and the eager-falling-back
runner must fail, and a gather with one more kernel must fail on its launch counts. The runner
reports were written before speed-ups had groups: their figures are rebuilt from their rows by
today's :func:`harness.bench.runner.figures_of`, so the replay runs the real figure and comparison
code on real measurements. The quick set (``bench runner --quick``) is replayed on the same rows.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from harness.bench import Stat, compare, failed
from harness.bench.baseline import Thresholds, check_comparable, format_findings
from harness.bench.runner import QUICK, figures_of

DATA = Path(__file__).resolve().parent / "data" / "h200-run1"
QUICK_BATCHES = {"+".join(c.split(",")) for c in QUICK["compositions"].split(";")}


def load(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


def regrouped(report: dict, *, quick: bool = False) -> dict:
    """The runner report with figures rebuilt from its rows; ``quick``: only the quick set's batches."""
    report = copy.deepcopy(report)
    rows = []
    for row in report["rows"]:
        if row["kind"] == "batch" and quick and row["batch"] not in QUICK_BATCHES:
            continue
        if row["kind"] == "capture" and quick:
            continue  # the quick set captures other buckets: its capture counts are not in this run
        rows.append({k: Stat(**v) if isinstance(v, dict) and "median" in v else v for k, v in row.items()})
    report["figures"] = {k: dataclasses.asdict(f) for k, f in figures_of(rows).items()}
    return report


def findings_of(run: str, *, quick: bool = False) -> list:
    return compare(regrouped(load(run), quick=quick), regrouped(load("runner-baseline"), quick=quick))


def groups(findings: list) -> dict[str, str]:
    return {f.key.split("/speedup")[0]: f.verdict for f in findings if f.key.endswith("(geometric mean)")}


MODELS = ["dense/tiny", "moe/tiny", "dense/large", "moe/large"]


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
def test_rerun_against_its_own_baseline_passes(quick):
    findings = findings_of("runner-rerun", quick=quick)
    assert not failed(findings), format_findings(findings, baseline_path="runner-baseline", thresholds=Thresholds())
    assert sorted(groups(findings)) == sorted(MODELS)  # every model's speed-ups were gated, none skipped
    # The rerun's host-bound times did move beyond their bands: reported, not failed.
    assert {f.verdict for f in findings if f.kind == "time"} >= {"slower"}


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
def test_slowed_runner_fails_on_every_models_mean_speedup(quick):
    findings = findings_of("runner-slowed", quick=quick)
    assert groups(findings) == dict.fromkeys(MODELS, "regression")
    assert {f.kind for f in failed(findings)} == {"speedup"}  # its counts are the reference's


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
def test_eager_fallback_runner_fails_on_launches_and_speedups(quick):
    findings = findings_of("runner-eager-fallback", quick=quick)
    launches = {f.key: (f.baseline, f.current) for f in failed(findings) if f.key.endswith("/launches_run")}
    assert launches["moe/large/8+8+8+7/launches_run"] == (439, 1116)  # the run launches what eager launches
    assert len(launches) == (8 if quick else 20)  # every batch of every model
    assert groups(findings) == dict.fromkeys(MODELS, "regression")


def test_gather_rerun_passes_and_one_more_kernel_fails_on_counts_only():
    baseline, rerun = load("gather-baseline"), load("gather-rerun")
    findings = compare(rerun, baseline)
    assert not failed(findings), format_findings(findings, baseline_path="gather-baseline", thresholds=Thresholds())
    # gather_with_extra_kernel: one more launch per call and per replay, its times as fast as the rerun's.
    extra = copy.deepcopy(rerun)
    for key, figure in extra["figures"].items():
        if key.endswith("launches"):
            figure["value"] += 1
    bad = failed(compare(extra, baseline))
    assert bad and {f.kind for f in bad} == {"count"}
    assert {f.key.rsplit("/", 1)[1] for f in bad} == {"launches", "graph_launches"}


def test_gather_run_of_another_lease_passes_against_the_committed_h200_baseline():
    """A second H200 lease (run 3, another machine start) measured the gather again: against the
    committed baseline (run 1) nothing gated may fail, though its host-bound plain-call times moved
    beyond their noise bands."""
    committed = json.loads((Path(__file__).resolve().parent.parent / "harness" / "bench" / "baselines"
                            / "h200-gather.json").read_text(encoding="utf-8"))
    later = json.loads((DATA.parent / "h200-run3" / "gather-baseline.json").read_text(encoding="utf-8"))
    check_comparable(later, committed)
    findings = compare(later, committed)
    assert not failed(findings), format_findings(findings, baseline_path="h200-gather.json", thresholds=Thresholds())
