"""The baseline policy replayed on the reports of the first H200 run (tests/data/h200-run1/).

That run (torch 2.11, ``--repeat 15``, the full runner table) was measured under gate version 1: its
rows hold the segments' and the runner's time as the GPU timeline saw them, with the host's launch
latency inside, not the figures gate version 2 gates (segment GPU time with the GPU kept ahead of the
host, the runner's host overhead against a host reference). Replayed with today's
:func:`harness.bench.runner.figures_of` and comparison, they show what still holds: a rerun against its
own baseline passes, the swinging figures (speed-ups, eager and replay times) are reported and never fail,
even the fall of a model's mean speed-up that failed a correct runner on the H200, and the eager-falling-back
runner fails on its launch counts; a gather with one more kernel fails on its launch counts. The slowed
runners are caught by the gated host ratio, which these rows do not hold (tests/test_bench_confirm.py
replays that gate on synthetic figures). The quick set (``bench runner --quick``) is replayed on the same
rows.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
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
    assert sorted(groups(findings)) == sorted(MODELS)  # every model's mean speed-up was compared, none skipped
    # The rerun's host-bound times did move beyond their bands: reported, not failed.
    assert {f.verdict for f in findings if f.kind == "time"} >= {"slower"}


@pytest.mark.parametrize("run", ["runner-rerun", "runner-slowed"])
def test_the_swinging_figures_are_reported_never_gated(run):
    findings = findings_of(run)
    assert {f.kind for f in findings if f.gated} == {"count"}  # these rows hold no figure of gate version 2
    assert not failed(findings)
    if run == "runner-slowed":  # its speed-ups fell beyond their bands: said, not failed
        assert set(groups(findings).values()) == {"slower"}


def test_the_fall_of_a_models_mean_speedup_that_failed_a_correct_runner_is_reported():
    """On the H200, ``dense/large/speedup (geometric mean): 2.594 -> 1.555`` failed a correct runner under gate
    version 1 (issue 33). The same fall, made from the rerun's rows, is reported as slower and fails nothing."""
    baseline, rerun = regrouped(load("runner-baseline"), quick=True), regrouped(load("runner-rerun"), quick=True)
    speedups = {k: f for k, f in rerun["figures"].items() if k.startswith("dense/large/") and k.endswith("/speedup")}
    before = {k: baseline["figures"][k]["value"] for k in speedups}
    mean_before = math.exp(sum(math.log(v) for v in before.values()) / len(before))
    for key, figure in speedups.items():
        figure["value"] = before[key] * 1.555 / 2.594
    findings = {f.key: f for f in compare(rerun, baseline)}
    mean = findings["dense/large/speedup (geometric mean)"]
    assert mean.verdict == "slower" and not mean.gated and mean.current == pytest.approx(mean_before * 1.555 / 2.594)
    assert not failed(list(findings.values()))


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
def test_eager_fallback_runner_fails_on_launches(quick):
    findings = findings_of("runner-eager-fallback", quick=quick)
    launches = {f.key: (f.baseline, f.current) for f in failed(findings) if f.key.endswith("/launches_run")}
    assert launches["moe/large/8+8+8+7/launches_run"] == (439, 1116)  # the run launches what eager launches
    assert len(launches) == (8 if quick else 20)  # every batch of every model
    assert {f.kind for f in failed(findings)} == {"count"}


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
