"""What a selfcheck run writes: this machine's timings go to the hints cache, never into the committed kill matrix.

``python -m harness selfcheck`` on a checkout must leave ``git status`` clean: the kill matrix
(``golden/selfcheck/kill_matrix.json``) holds only which test kills which mutant per backend and changes only
under ``--update-kill-matrix``; how long each kill took here, and so which mutants start first, is in
``.harness_cache/selfcheck-hints.json``, which every run rewrites."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import cli, impls, locations, selfcheck

ROOT = Path(__file__).resolve().parent.parent
RUN = ["selfcheck", "--component", "graphs", "--graph-backend", "emulated", "--device", "cpu", "--jobs", "1",
       "--no-fork-server"]
JUDGED = [impl.name for impl in impls.mutants("graphs") if impl.judged_on("emulated")]


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout holding the committed kill matrix, where the matrix's runs are faked (no child process)."""
    golden = tmp_path / selfcheck.KILL_MATRIX_PATH
    golden.parent.mkdir(parents=True)
    shutil.copyfile(ROOT / selfcheck.KILL_MATRIX_PATH, golden)
    monkeypatch.setattr(locations, "project_root", lambda: tmp_path)
    monkeypatch.setattr(locations, "is_checkout", lambda: True)
    monkeypatch.setattr(selfcheck, "reference_workers", lambda: 1)  # every run goes through run_one
    return tmp_path


def _fake_runs(monkeypatch: pytest.MonkeyPatch, *, seconds: dict[str, float] | None = None,
               killed_by: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """Fake each run: a mutant is killed by the first test it is given (or ``killed_by``'s) after ``seconds``'
    seconds (default 1). Returns the runs' ``(spec, first tests)`` in start order."""
    started: list[tuple[str, str]] = []

    def fake_run_one(impl: impls.Implementation, *, first: str = "", **_: object) -> selfcheck.Outcome:
        started.append((impl.name, first))
        if impl.kind == "reference":
            return selfcheck.Outcome(impl.component, impl.name, impl.kind, "passed", "", 9.0, "", "", None, "emulated")
        test = (killed_by or {}).get(impl.name) or (first.splitlines() or [f"suites/graphs/t.py::{impl.name}"])[0]
        took = (seconds or {}).get(impl.name, 1.0)
        return selfcheck.Outcome(impl.component, impl.name, impl.kind, "killed", test, took + 1, "", impl.bug, took,
                                 "emulated", (test,))

    monkeypatch.setattr(selfcheck, "run_one", fake_run_one)
    return started


def _mutants_started(started: list[tuple[str, str]]) -> list[str]:
    return [name for name, _ in started if name != "reference"]


def test_the_committed_kill_matrix_holds_no_timings():
    document = json.loads((ROOT / selfcheck.KILL_MATRIX_PATH).read_text())
    assert document["kills"], "the kill matrix is empty"
    assert {tuple(sorted(entry)) for entry in document["kills"]} == {
        ("component", "graph_backend", "killing_test", "mutant")}


def test_a_run_with_slow_kills_leaves_the_kill_matrix_byte_identical_and_caches_them(checkout: Path, monkeypatch,
                                                                                     capsys):
    before = (checkout / selfcheck.KILL_MATRIX_PATH).read_bytes()
    slow = {JUDGED[1]: 20.0, JUDGED[-1]: 40.0}  # the last registered is the slowest
    started = _fake_runs(monkeypatch, seconds=slow)
    assert cli.main(RUN) == 0
    assert (checkout / selfcheck.KILL_MATRIX_PATH).read_bytes() == before
    assert "differ from" not in capsys.readouterr().out  # every kill as committed
    cached = selfcheck.read_hints_cache(checkout)
    assert {key for key, entry in cached.items() if entry["slow"]} == {("graphs", name, "emulated") for name in slow}
    assert cached["graphs", JUDGED[-1], "emulated"]["seconds_to_kill"] == 40.0
    assert _mutants_started(started) == JUDGED  # no cache yet: as registered
    assert (checkout / ".harness_cache" / ".gitignore").read_text().splitlines()[-1] == "*"

    # The next run starts this machine's slow kills first, the slowest first, and still leaves the golden alone.
    started = _fake_runs(monkeypatch)
    assert cli.main(RUN) == 0
    assert _mutants_started(started)[:2] == [JUDGED[-1], JUDGED[1]]
    assert sorted(_mutants_started(started)) == sorted(JUDGED)
    assert (checkout / selfcheck.KILL_MATRIX_PATH).read_bytes() == before
    assert not selfcheck.read_slow_kills(checkout)  # fast this time: cleared


def test_keep_hints_writes_no_cache(checkout: Path, monkeypatch):
    _fake_runs(monkeypatch, seconds={JUDGED[0]: 30.0})
    assert cli.main([*RUN, "--keep-hints"]) == 0
    assert not (checkout / selfcheck.HINTS_CACHE_PATH).exists()


@pytest.mark.parametrize("content", ["{not json", '{"kills": [{"component": "graphs"}]}', '{"kills": 3}',
                                     '{"kills": [{"component": "graphs", "mutant": "m", "graph_backend": "emulated", '
                                     '"killing_test": "t", "seconds_to_kill": "slow"}]}'],
                         ids=["not-json", "missing-fields", "wrong-shape", "wrong-type"])
def test_a_corrupt_cache_costs_one_line_and_is_rewritten(checkout: Path, monkeypatch, capsys, content: str):
    cache = checkout / selfcheck.HINTS_CACHE_PATH
    cache.parent.mkdir(parents=True)
    cache.write_text(content)
    started = _fake_runs(monkeypatch, seconds={JUDGED[0]: 30.0})
    assert cli.main(RUN) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "hints cache" in line]
    assert len(err) == 1 and "ignoring the unreadable hints cache" in err[0], err
    assert _mutants_started(started) == JUDGED
    assert selfcheck.read_slow_kills(checkout) == {("graphs", JUDGED[0], "emulated")}  # rewritten, readable again


def test_a_moved_kill_is_one_line_and_recorded_only_on_update(checkout: Path, monkeypatch, capsys):
    golden = checkout / selfcheck.KILL_MATRIX_PATH
    before = golden.read_bytes()
    mutant = JUDGED[0]
    committed = selfcheck.read_hints(checkout)["graphs", mutant, "emulated"]
    moved = "suites/graphs/test_moved.py::test_elsewhere"
    _fake_runs(monkeypatch, killed_by={mutant: moved})
    assert cli.main(RUN) == 0  # a plain run: the kill moved, the golden stays
    assert golden.read_bytes() == before
    assert "1 killing tests differ from golden/selfcheck/kill_matrix.json" in capsys.readouterr().out
    # This machine remembers the new killer: the next run gives the committed test first, then it.
    started = _fake_runs(monkeypatch, killed_by={mutant: moved})
    assert cli.main([*RUN, "--check-kill-matrix"]) == 1
    assert dict(started)[mutant] == f"{committed}\n{moved}"
    assert golden.read_bytes() == before
    # Deliberately recorded: the golden names the new test, with no timing in it.
    _fake_runs(monkeypatch, killed_by={mutant: moved}, seconds={mutant: 30.0})
    assert cli.main([*RUN, "--update-kill-matrix"]) == 0
    assert selfcheck.read_hints(checkout)["graphs", mutant, "emulated"] == moved
    assert "seconds" not in golden.read_text() and '"slow"' not in golden.read_text()
    changed = [line for line in golden.read_text().splitlines() if line not in before.decode().splitlines()]
    assert changed == [f'      "killing_test": "{moved}"'], changed


def test_update_kill_matrix_is_refused_for_an_installed_harness(checkout: Path, monkeypatch, capsys):
    monkeypatch.setattr(locations, "is_checkout", lambda: False)
    started = _fake_runs(monkeypatch)
    assert cli.main([*RUN, "--update-kill-matrix"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --update-kill-matrix") and "\n" not in err, err
    assert not started


def test_first_tests_are_the_committed_then_this_machines_last():
    hints = {("graphs", "mutant:a", "emulated"): "t::committed"}
    cached = {("graphs", "mutant:a", "emulated"): {"killing_test": "t::here"},
              ("graphs", "mutant:b", "emulated"): {"killing_test": "t::b"}}
    assert selfcheck.first_tests(hints, cached, "graphs", "mutant:a", "emulated") == "t::committed\nt::here"
    assert selfcheck.first_tests(hints, {}, "graphs", "mutant:a", "emulated") == "t::committed"
    assert selfcheck.first_tests(hints, cached, "graphs", "mutant:b", "emulated") == "t::b"
    assert selfcheck.first_tests({}, {}, "graphs", "mutant:c", "emulated") == ""
