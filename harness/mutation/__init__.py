"""Mutation testing of the references (``python -m harness mutate``): mutmut mutates each area's modules, the suites
run against every mutant, and each survivor is classified by the area's committed triage file.

:func:`evaluate` turns a run's mutants into scores (:mod:`harness.mutation.score`) and the untriaged survivors;
:func:`run_mutation` runs the tool (:mod:`harness.mutation.mutmut_tool`) and reports. ``docs/mutation.md`` says
how to run it, what the verdicts mean and how to triage a new survivor."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.mutation.areas import AREAS, Area, get_area
from harness.mutation.mutmut_tool import RESULTS_FILE, ensure_mutmut, prepare_scratch, read_results, run_mutmut
from harness.mutation.score import GOAL, AreaScore, format_scores, score_area
from harness.mutation.triage import Mutant, TriageEntry, classify, load_triage

__all__ = ["AREAS", "Evaluation", "evaluate", "report", "run_mutation", "rescore", "show_mutant", "SCRATCH_DIR",
           "SITE_DIR"]

#: Under the harness's state folder (gitignored ``.harness_cache/`` of a checkout): the copy mutmut works in, and
#: mutmut's own install.
SCRATCH_DIR = Path(".harness_cache") / "mutation"
SITE_DIR = Path(".harness_cache") / "mutmut-site"
_RUN_FILE = "run.json"  # what the last run was (areas, the mutants run, sample, time): for --rescore


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """A run judged by the triage files: the score per area, each mutant's verdict by mutmut name, the survivors no
    triage file names, and (for a whole run) triage entries that name no survivor any more."""

    scores: list[AreaScore]
    verdicts: dict[str, str]
    untriaged: list[Mutant]
    stale: list[tuple[str, TriageEntry]]

    @property
    def ok(self) -> bool:
        return all(score.meets_goal for score in self.scores)


def evaluate(mutants: Sequence[Mutant], areas: Sequence[Area], *, root: Path,
             sampled_from: dict[str, int] | None = None) -> Evaluation:
    """Classify ``mutants`` by each area's ``docs/mutation/<area>.json`` under ``root``. ``sampled_from`` (each
    area's mutant count) marks a sample: its scores say so, and no triage entry is called stale."""
    scores, verdicts, untriaged, stale = [], {}, [], []
    for area in areas:
        triage = load_triage(root / area.triage_path, area=area.name)
        own = [m for m in mutants if m.area == area.name]
        for mutant in own:
            verdicts[mutant.name] = classify(mutant, triage)
        untriaged += [m for m in own if verdicts[m.name] == "untriaged"]
        scores.append(score_area(area.name, (verdicts[m.name] for m in own),
                                 sampled_from=None if sampled_from is None else sampled_from[area.name]))
        if sampled_from is None:
            surviving = {m.key for m in own if m.survived}
            stale += [(area.name, entry) for key, entry in triage.items() if key not in surviving]
    return Evaluation(scores, verdicts, untriaged, stale)


def report(evaluation: Evaluation) -> str:
    """The table, then what fails the run: each untriaged survivor with its diff and how to show it, an area below
    the goal; and triage entries that no longer match a survivor (a note: the suites may have learnt to kill it)."""
    lines = [format_scores(evaluation.scores)]
    for mutant in evaluation.untriaged:
        lines += ["", f"UNTRIAGED survivor of {mutant.area}: {mutant.function}, mutant {mutant.name} "
                      f"({mutant.status}); add it to {get_area(mutant.area).triage_path} or kill it with a test:",
                  f'  "function": "{mutant.function}", "mutation": {json.dumps(mutant.mutation)}'
                  + (f', "occurrence": {mutant.occurrence}' if mutant.occurrence > 1 else ""),
                  *(f"    {line}" for line in mutant.diff.splitlines()),
                  f"  show it again: python -m harness mutate --show {mutant.name}"]
    for score in evaluation.scores:
        if score.score < GOAL:
            lines += ["", f"{score.area}: {score.killed} of {score.judged} non-equivalent mutants killed "
                          f"({100 * score.score:.1f}%), below the goal of {100 * GOAL:.0f}%"]
    for area, entry in evaluation.stale:
        lines += ["", f"note: {get_area(area).triage_path} lists {entry.function}: {entry.mutation} "
                      f"(occurrence {entry.occurrence}), which no longer survives; remove the entry"]
    return "\n".join(lines)


def run_mutation(area_names: Sequence[str], *, root: Path, state: Path, jobs: int, sample: int | None = None,
                 seed: int = 0, json_path: Path | None = None) -> int:
    """Run mutmut over the named areas (all where none is named), print the table and the failures; 0 when every
    survivor is triaged and every area scores at least :data:`GOAL`."""
    areas = [get_area(name) for name in (area_names or AREAS)]
    started = time.perf_counter()
    site = ensure_mutmut(state / SITE_DIR)
    scratch = state / SCRATCH_DIR
    prepare_scratch(root, scratch, areas)
    print(f"mutating {', '.join(a.name for a in areas)} in {scratch}"
          + (f" (a sample of {sample} per area, seed {seed})" if sample is not None else ""), flush=True)
    mutants, totals = run_mutmut(site, scratch, areas, jobs=jobs, sample=sample, seed=seed)
    wall = time.perf_counter() - started
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / _RUN_FILE).write_text(json.dumps({"areas": [a.name for a in areas], "names": [m.name for m in mutants],
                                                 "totals": totals, "sample": sample, "seed": seed,
                                                 "wall_seconds": round(wall, 1), "jobs": jobs}))
    return _finish(mutants, areas, root=root, totals=totals, wall=wall, jobs=jobs, sample=sample, seed=seed,
                   json_path=json_path)


def rescore(*, root: Path, state: Path, json_path: Path | None = None) -> int:
    """Judge the last run again by the triage files as they are now, without running mutmut (for triaging)."""
    scratch = state / SCRATCH_DIR
    if not (scratch / _RUN_FILE).exists():
        raise HarnessError(f"no mutation run left its results in {scratch}; run python -m harness mutate first")
    run = json.loads((scratch / _RUN_FILE).read_text())
    mutants = read_results(scratch, run["names"])
    return _finish(mutants, [get_area(name) for name in run["areas"]], root=root, totals=run["totals"],
                   wall=run["wall_seconds"], jobs=run["jobs"], sample=run["sample"], seed=run["seed"],
                   json_path=json_path)


def _finish(mutants: Sequence[Mutant], areas: Sequence[Area], *, root: Path, totals: dict[str, int], wall: float,
            jobs: int, sample: int | None, seed: int, json_path: Path | None) -> int:
    evaluation = evaluate(mutants, areas, root=root, sampled_from=None if sample is None else totals)
    print(report(evaluation))
    print(f"{len(mutants)} mutants in {wall:.0f} s ({wall / max(len(mutants), 1):.1f} s per mutant, --jobs {jobs})")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(_as_json(evaluation, mutants, wall, sample=sample, seed=seed), indent=1) + "\n")
    return 0 if evaluation.ok else 1


def _as_json(evaluation: Evaluation, mutants: Sequence[Mutant], wall: float, *, sample: int | None,
             seed: int) -> dict[str, Any]:
    return {"sample": sample, "seed": seed if sample is not None else None, "wall_seconds": round(wall, 1),
            "areas": [score.as_json() for score in evaluation.scores],
            "survivors": [{"area": m.area, "name": m.name, "function": m.function, "mutation": m.mutation,
                           "occurrence": m.occurrence, "verdict": evaluation.verdicts[m.name]}
                          for m in mutants if m.survived]}


def show_mutant(state: Path, name: str) -> str:
    """The diff and status of mutant ``name`` from the last run's results."""
    results = state / SCRATCH_DIR / RESULTS_FILE
    if not results.exists():
        raise HarnessError(f"no mutation run left results in {results}; run python -m harness mutate first")
    for row in json.loads(results.read_text()):
        if row["name"] == name:
            return f"# {name}: exit code {row['exit_code']}\n{row['diff']}"
    raise HarnessError(f"the last mutation run ({results}) has no mutant {name}")
