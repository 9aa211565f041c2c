"""Contract clauses: the table, the docs and the suites' markers agree."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import components
from harness.conformance import clauses

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = sorted(clauses.CLAUSES)


def test_every_component_declares_its_clauses():
    # A component without a table has no conformance report, and its suite's markers would go unchecked.
    assert sorted(components.component_names()) == COMPONENTS


@pytest.mark.parametrize("component", COMPONENTS)
def test_the_table_is_well_formed(component):
    table = clauses.clauses_of(component)
    ids = [clause.id for clause in table]
    assert len(set(ids)) == len(ids), f"duplicate clause ids in {component}"
    assert all(clause.tier in clauses.TIERS and clause.summary and clause.component == component for clause in table)
    assert {clause.tier for clause in table} == {clauses.CORE, clauses.STRICT}


@pytest.mark.parametrize("component", COMPONENTS)
def test_the_doc_states_every_clause_with_its_tier(component):
    doc = (ROOT / components.get_component(component).doc).read_text()
    missing = [f"[`{c.id}`, {c.tier}]" for c in clauses.clauses_of(component) if f"[`{c.id}`, {c.tier}]" not in doc]
    assert not missing, f"{components.get_component(component).doc} lacks these clause tags: {missing}"


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_clause_tag_in_the_doc_is_in_the_table(component):
    path = components.get_component(component).doc
    table = {(c.id, c.tier) for c in clauses.clauses_of(component)}
    tags = set(re.findall(rf"\[`([\w-]+)`, ({clauses.CORE}|{clauses.STRICT})\]", (ROOT / path).read_text()))
    stale = sorted(f"[`{clause_id}`, {tier}]" for clause_id, tier in tags - table)
    assert not stale, f"{path} tags clauses the table lacks, or gives them another tier: {stale}"


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> dict[str, dict[str, str | None]]:
    """component -> {test node id: clause}, from a collection with the conformance plugin."""
    record = tmp_path_factory.mktemp("clauses") / "record.jsonl"
    suites = [components.get_component(c).suite for c in COMPONENTS]
    completed = subprocess.run([sys.executable, "-m", "pytest", *suites, "--collect-only", "-q",
                                "-p", "no:cacheprovider", "-p", "harness.conformance.plugin"],
                               cwd=ROOT, capture_output=True, text=True,
                               env=dict(os.environ, HARNESS_CONFORMANCE_RECORD=str(record)))
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    found: dict[str, dict[str, str | None]] = {c: {} for c in COMPONENTS}
    for line in record.read_text().splitlines():
        entry = json.loads(line)
        component = next(c for c in COMPONENTS
                         if entry["collected"].startswith(components.get_component(c).suite + "/"))
        found[component][entry["collected"]] = entry["clause"]
    return found


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_test_names_a_clause_and_every_clause_has_a_test(collected, component):
    known = {c.id for c in clauses.clauses_of(component)}
    tests = collected[component]
    assert tests, f"nothing collected from {component}'s suite"
    unnamed = sorted(nodeid for nodeid, clause in tests.items() if clause not in known)
    assert not unnamed, (f"tests of {component} without a clause of harness/conformance/clauses.py (mark them "
                         f"@pytest.mark.clause(ID)): {unnamed[:10]}")
    untested = sorted(known - set(tests.values()))
    assert not untested, f"clauses of {component} that no test checks: {untested}"
