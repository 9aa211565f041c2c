"""``python -m harness mutate`` without mutmut: survivors classified by a triage file, the score's arithmetic, the
failure that names untriaged survivors, and the command's exit status, on fake mutants."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import mutation
from harness.errors import HarnessError
from harness.mutation import evaluate, report
from harness.mutation.areas import AREAS, area_of_file
from harness.mutation.mutmut_tool import mutmut_config
from harness.mutation.score import AreaScore, format_markdown, format_scores, score_area
from harness.mutation.triage import Mutant, classify, function_of, load_triage, mutation_of, with_occurrences

_DIFF = """--- harness/gather/relay.py
+++ harness/gather/relay.py
@@ -1,3 +1,3 @@
 def pending_slots(self) -> list[int]:
-    return (self.output_tokens_buf >= 0).nonzero().flatten().tolist()
+    return (self.output_tokens_buf  >  0).nonzero().flatten().tolist()
"""
_MUTATION = ("return (self.output_tokens_buf >= 0).nonzero().flatten().tolist() => "
             "return (self.output_tokens_buf > 0).nonzero().flatten().tolist()")


def _mutant(number: int, status: str, *, area: str = "relay", method: str = "pending_slots",
            mutation: str | None = None) -> Mutant:
    return Mutant(area=area, name=f"harness.gather.relay.xǁSpecExtrasRelayǁ{method}__mutmut_{number}",
                  function=f"harness.gather.relay.SpecExtrasRelay.{method}", mutation=mutation or f"a => b{number}",
                  diff=f"-a\n+b{number}", status=status)


def _triage(root: Path, area: str, survivors: list[dict]) -> None:
    path = root / AREAS[area].triage_path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"area": area, "files": list(AREAS[area].files), "survivors": survivors}))


def test_mutmut_names_become_qualified_function_names():
    assert function_of("harness.gather.relay.xǁSpecExtrasRelayǁ__init____mutmut_12") == \
        "harness.gather.relay.SpecExtrasRelay.__init__"
    assert function_of("harness.gather.reference.x_eager_gather__mutmut_3") == "harness.gather.reference.eager_gather"


def test_a_mutation_is_its_changed_lines_whitespace_normalised():
    assert mutation_of(_DIFF) == _MUTATION


def test_repeated_mutations_of_one_function_are_numbered():
    mutants = with_occurrences([_mutant(1, "survived", mutation="x => y"), _mutant(2, "survived", mutation="x => z"),
                                _mutant(3, "survived", mutation="x => y"),
                                _mutant(4, "survived", method="stash", mutation="x => y")])
    assert [m.occurrence for m in mutants] == [1, 1, 2, 1]


def test_survivors_are_classified_by_the_triage_file(tmp_path):
    _triage(tmp_path, "relay", [
        {"function": "harness.gather.relay.SpecExtrasRelay.pending_slots", "mutation": "a  =>  b1",
         "verdict": "equivalent", "why": "w"},
        {"function": "harness.gather.relay.SpecExtrasRelay.pending_slots", "mutation": "a => b2",
         "verdict": "message-only", "why": "w"},
        {"function": "harness.gather.relay.SpecExtrasRelay.pending_slots", "mutation": "a => b3", "occurrence": 2,
         "verdict": "missed", "why": "w"},
    ])
    triage = load_triage(tmp_path / AREAS["relay"].triage_path, area="relay")
    assert classify(_mutant(1, "survived"), triage) == "equivalent"  # the file's spacing does not matter
    assert classify(_mutant(2, "no tests"), triage) == "message-only"
    assert classify(_mutant(3, "survived"), triage) == "untriaged"  # occurrence 1, the file names the second
    assert classify(_mutant(4, "timeout"), triage) == "killed"
    with pytest.raises(HarnessError, match="not run to a verdict"):
        classify(_mutant(5, "not checked"), triage)


@pytest.mark.parametrize("entry, message", [
    ({"function": "f", "mutation": "a => b", "verdict": "fine", "why": "w"}, "choose from equivalent"),
    ({"function": "f", "mutation": "a => b", "verdict": "missed"}, "has no why"),
])
def test_a_malformed_triage_entry_is_refused_by_name(tmp_path, entry, message):
    _triage(tmp_path, "relay", [entry])
    with pytest.raises(HarnessError, match=message):
        load_triage(tmp_path / AREAS["relay"].triage_path, area="relay")


def test_a_triage_entry_listed_twice_is_refused(tmp_path):
    entry = {"function": "f", "mutation": "a => b", "verdict": "missed", "why": "w"}
    _triage(tmp_path, "relay", [entry, entry])
    with pytest.raises(HarnessError, match="listed twice"):
        load_triage(tmp_path / AREAS["relay"].triage_path, area="relay")


def test_the_score_leaves_out_equivalent_and_message_only_mutants():
    score = score_area("relay", ["killed"] * 18 + ["equivalent"] * 5 + ["message-only"] * 7 + ["missed"] * 2)
    assert (score.mutants, score.judged) == (32, 20)
    assert score.score == pytest.approx(0.9) and score.meets_goal
    below = score_area("relay", ["killed"] * 17 + ["missed"] * 3)
    assert below.score == pytest.approx(0.85) and not below.meets_goal
    untriaged = score_area("relay", ["killed"] * 99 + ["untriaged"])
    assert untriaged.score == pytest.approx(0.99) and not untriaged.meets_goal
    assert score_area("relay", ["equivalent"]).score == 1.0  # nothing a caller could notice
    table = format_scores([score, AreaScore("gather", 3, 3, 0, 0, 0, 0, sampled_from=20)])
    assert "18/20 = 90.0%" in table and "gather (sample of 3 of 20)" in table


def test_an_untriaged_survivor_fails_the_run_and_is_named_with_its_diff(tmp_path):
    _triage(tmp_path, "relay", [{"function": "harness.gather.relay.SpecExtrasRelay.pending_slots",
                                 "mutation": "a => b1", "verdict": "equivalent", "why": "w"}])
    mutants = [_mutant(1, "survived"), _mutant(2, "survived"), *(_mutant(n, "killed") for n in range(3, 30))]
    evaluation = evaluate(mutants, [AREAS["relay"]], root=tmp_path)
    assert not evaluation.ok and [m.name for m in evaluation.untriaged] == [mutants[1].name]
    text = report(evaluation)
    named = f"UNTRIAGED survivor of relay: harness.gather.relay.SpecExtrasRelay.pending_slots, mutant {mutants[1].name}"
    assert named in text
    assert '"mutation": "a => b2"' in text and "    +b2" in text and f"mutate --show {mutants[1].name}" in text


def test_a_whole_run_notes_triage_entries_that_no_longer_survive(tmp_path):
    _triage(tmp_path, "relay", [{"function": "g", "mutation": "a => b", "verdict": "equivalent", "why": "w"}])
    evaluation = evaluate([_mutant(1, "killed")], [AREAS["relay"]], root=tmp_path)
    assert evaluation.ok and "no longer survives" in report(evaluation)
    sample = evaluate([_mutant(1, "killed")], [AREAS["relay"]], root=tmp_path, sampled_from={"relay": 200})
    assert not sample.stale and "sample of 1 of 200" in report(sample)


def test_the_command_exits_1_on_an_untriaged_survivor_and_writes_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(mutation, "ensure_mutmut", lambda site: None)
    monkeypatch.setattr(mutation, "prepare_scratch", lambda root, scratch, areas: None)
    mutants = [_mutant(1, "survived"), _mutant(2, "killed")]
    monkeypatch.setattr(mutation, "run_mutmut", lambda *args, **kwargs: (mutants, {"relay": 2}))
    out = tmp_path / "reports" / "mutation.json"
    assert mutation.run_mutation(["relay"], root=tmp_path, state=tmp_path, jobs=1, json_path=out) == 1
    run = json.loads(out.read_text())
    assert run["areas"][0]["untriaged"] == 1 and run["survivors"][0]["verdict"] == "untriaged"
    assert "UNTRIAGED" in capsys.readouterr().out
    assert "| relay | 2 | 1 | 0 | 0 | 0 | 1 | 1/2 = 50.0% |" in format_markdown(run)
    _triage(tmp_path, "relay", [{"function": mutants[0].function, "mutation": mutants[0].mutation,
                                 "verdict": "equivalent", "why": "w"}])
    assert mutation.run_mutation(["relay"], root=tmp_path, state=tmp_path, jobs=1) == 0


def test_every_area_file_exists_and_belongs_to_one_area():
    root = Path(__file__).resolve().parents[1]
    for area in AREAS.values():
        for file in area.files:
            assert (root / file).is_file(), f"{area.name}: {file} does not exist"
            assert area_of_file(file) is area
        assert all((root / suite).exists() for suite in area.suites), area.suites
    config = mutmut_config([AREAS["relay"]])
    assert 'only_mutate = ["harness/gather/relay.py"]' in config and '["suites/gather"]' in config


def test_the_committed_triage_files_are_well_formed():
    root = Path(__file__).resolve().parents[1]
    for area in AREAS.values():
        path = root / area.triage_path
        if path.exists():
            data = json.loads(path.read_text())
            assert data["files"] == list(area.files), f"{path}: files {data['files']}, the area has {area.files}"
            load_triage(path, area=area.name)


def test_an_areas_test_file_outside_the_copied_folders_is_copied_with_its_conftest(tmp_path):
    from harness.mutation.areas import Area
    from harness.mutation.mutmut_tool import prepare_scratch

    root = Path(__file__).resolve().parents[1]
    scratch = tmp_path / "scratch"
    prepare_scratch(root, scratch, [Area("toy", ("harness/graphs/_emulated.py",), ("tests/test_emulated_pool.py",))])
    assert (scratch / "tests/test_emulated_pool.py").is_file() and (scratch / "tests/conftest.py").is_file()
    assert not (scratch / "tests/test_mutation.py").exists(), "only the area's own test files"
