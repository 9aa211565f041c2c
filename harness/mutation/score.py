"""The score of an area: killed / (mutants - equivalent - message-only), with the counts it comes from."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from typing import Any

__all__ = ["AreaScore", "GOAL", "score_area", "format_scores", "format_markdown"]

#: The share of non-equivalent mutants the suites must kill (issue 45).
GOAL = 0.9


@dataclasses.dataclass(frozen=True)
class AreaScore:
    """Counts of one area's run; ``sampled_from`` is the area's mutant count where only a sample ran."""

    area: str
    mutants: int
    killed: int
    equivalent: int
    message_only: int
    missed: int
    untriaged: int
    sampled_from: int | None = None

    @property
    def judged(self) -> int:
        """The mutants a caller could tell from the reference (not equivalent, not message-only)."""
        return self.mutants - self.equivalent - self.message_only

    @property
    def score(self) -> float:
        return self.killed / self.judged if self.judged else 1.0

    @property
    def meets_goal(self) -> bool:
        return self.untriaged == 0 and self.score >= GOAL

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "judged": self.judged, "score": round(self.score, 4)}


def score_area(area: str, verdicts: Iterable[str], *, sampled_from: int | None = None) -> AreaScore:
    """The score of ``area`` from each mutant's verdict (:func:`harness.mutation.triage.classify`)."""
    counts = Counter(verdicts)
    unknown = set(counts) - {"killed", "equivalent", "message-only", "missed", "untriaged"}
    if unknown:
        raise ValueError(f"unknown verdicts {sorted(unknown)}")
    return AreaScore(area, sum(counts.values()), counts["killed"], counts["equivalent"], counts["message-only"],
                     counts["missed"], counts["untriaged"], sampled_from)


def format_scores(scores: Iterable[AreaScore]) -> str:
    """A table, one row per area: the counts and the score as ``killed/judged = percent``."""
    header = ("area", "mutants", "killed", "equivalent", "message-only", "missed", "untriaged", "score")
    rows = [header]
    for s in scores:
        name = s.area if s.sampled_from is None else f"{s.area} (sample of {s.mutants} of {s.sampled_from})"
        rows.append((name, str(s.mutants), str(s.killed), str(s.equivalent), str(s.message_only), str(s.missed),
                     str(s.untriaged), f"{s.killed}/{s.judged} = {100 * s.score:.1f}%"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def format_markdown(run: dict[str, Any]) -> str:
    """The Markdown of a run's JSON (``mutate --json``): the score table, and the untriaged survivors by name."""
    sample = run.get("sample")
    title = ("### Mutation score" + (f" (a sample of {sample} mutants per area, seed {run.get('seed')})"
                                     if sample is not None else ""))
    lines = [title, "", "| area | mutants | killed | equivalent | message-only | missed | untriaged | score |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for area in run["areas"]:
        of = f" of {area['sampled_from']}" if area.get("sampled_from") is not None else ""
        lines.append(f"| {area['area']} | {area['mutants']}{of} | {area['killed']} | {area['equivalent']} | "
                     f"{area['message_only']} | {area['missed']} | {area['untriaged']} | "
                     f"{area['killed']}/{area['judged']} = {100 * area['score']:.1f}% |")
    untriaged = [s for s in run.get("survivors", []) if s["verdict"] == "untriaged"]
    if untriaged:
        lines += ["", f"Untriaged survivors (goal: none, and at least {100 * GOAL:.0f}% killed):", ""]
        lines += [f"- {s['area']}: `{s['function']}`: `{s['mutation']}` "
                  f"(`python -m harness mutate --show {s['name']}`)" for s in untriaged]
    lines.append(f"\n{run.get('wall_seconds')} s in all.\n")
    return "\n".join(lines)
