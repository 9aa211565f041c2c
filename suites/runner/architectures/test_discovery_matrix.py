"""The discovery matrix of the transformers zoo, as a golden; the harness's rule must choose, on
every architecture, a module that owns the decoder-layer list and returns hidden states.
The rule of SGLang's PR 24662 is recorded, not enforced: its misses are its known behaviour (README);
SGLang 0.5.23's shipped rule is recorded in suites/runner/test_discovery.py, where its code is found."""

from __future__ import annotations

import pytest

from harness.golden import assert_upstream_golden
from harness.models.transformers_zoo import ARCHITECTURES, FAMILIES

pytestmark = pytest.mark.clause("discovery")

MIN_ARCHITECTURES = 40


def test_zoo_has_enough_architectures(zoo_discovery_matrix):
    available = [name for name, row in zoo_discovery_matrix.items() if "rules" in row]
    assert len(available) >= MIN_ARCHITECTURES, (
        f"only {len(available)} architectures build with this transformers; unavailable: "
        f"{ {name: row['unavailable'] for name, row in zoo_discovery_matrix.items() if 'rules' not in row} }")
    for family in FAMILIES:
        assert any(zoo_discovery_matrix[a.name].get("rules") for a in ARCHITECTURES if a.family == family), family


def test_harness_rule_picks_the_hidden_state_stack_everywhere(zoo_discovery_matrix):
    wrong = {name: row["rules"]["harness"] for name, row in zoo_discovery_matrix.items() if "rules" in row
             and not (row["rules"]["harness"]["owns_layer_list"]
                      and row["rules"]["harness"]["returns"] == "hidden_states"
                      and not row["rules"]["harness"]["fell_back"])}
    assert not wrong, f"the harness rule chose a module without the layer list or returning logits: {wrong}"


def test_harness_rule_never_picks_a_tower(zoo_discovery_matrix):
    towers = {name: row["rules"]["harness"]["path"] for name, row in zoo_discovery_matrix.items() if "rules" in row
              and any(word in row["rules"]["harness"]["path"] for word in ("vision", "visual", "audio"))}
    assert not towers, f"the harness rule chose a modality tower: {towers}"


def test_discovery_matrix_golden(zoo_discovery_matrix, snapshot):
    # One golden per transformers release: a release that moves a module shows as upstream drift against the
    # nearest recorded one, and --snapshot-update records its own as a reviewable diff.
    assert_upstream_golden(snapshot, zoo_discovery_matrix, package="transformers")
