"""A hang fails in bounded time, with one line naming what hung, in the three places it can happen:
inside a hypothesis test (whose examples hypothesis runs on after pytest-timeout's one signal), in the
start-up smoke call of an outside ``--impl``, and in a selfcheck child process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from harness import impls, selfcheck, timeouts
from harness.errors import ImplementationError

ROOT = Path(__file__).resolve().parent.parent

# Implementations that hang (sleep for an hour) from their SLEEPY_AFTER-th call on.
SLEEPY = '''
import os
import time

from harness.gather.reference import eager_gather

CALLS = 0


def gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf):
    global CALLS
    CALLS += 1
    if CALLS > int(os.environ.get("SLEEPY_AFTER", "0")):
        time.sleep(3600)
    return eager_gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf)
'''
SLEEPY_RUNNER = '''
import time


def make_runner(model, *, buckets, graphs, strict_discovery=False):
    time.sleep(3600)
'''

MACHINE = '''
import time

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule


class Counter(RuleBasedStateMachine):
    total = 0

    @rule(step=st.integers(min_value=1, max_value=3))
    def add(self, step):
        self.total += step
        if self.total >= 4:
            time.sleep(3600)


test_counter = Counter.TestCase
test_counter.settings = settings(max_examples=50, deadline=None, derandomize=True)
'''


@pytest.fixture
def sleepy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "sleepy_impl.py").write_text(SLEEPY)
    (tmp_path / "sleepy_runner.py").write_text(SLEEPY_RUNNER)
    # The sleeping modules first; what this interpreter itself needs on PYTHONPATH (a GPU check's carried
    # wheels, the checkout) kept after them.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    return tmp_path


def _pytest(*args: str, cwd: Path = ROOT, **environment: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          env={**os.environ, **environment}, capture_output=True, text=True, timeout=300)


def _test_seconds(junit: Path) -> dict[str, float]:
    return {case.get("name"): float(case.get("time")) for case in ElementTree.parse(junit).getroot().iter("testcase")}


@pytest.mark.long_running
def test_a_hang_inside_a_given_test_fails_within_its_limit_naming_the_example(sleepy: Path):
    junit = sleepy / "junit.xml"
    completed = _pytest("suites/gather/test_contract.py::test_matches_eager_oracle_over_the_contract[no-hidden]",
                        "--impl", "gather=sleepy_impl:gather", "--timeout", "4", f"--junitxml={junit}",
                        SLEEPY_AFTER="1")  # the second example hangs (dev draws two here, ci twelve)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 1, output[-3000:]
    message = re.search(r"^E\s+harness\.timeouts\.TimeLimitExceeded: (.*)$", output, re.MULTILINE)
    assert message, output[-3000:]
    assert "ran past its time limit of 4 s" in message[1]
    assert "while running the hypothesis example test_matches_eager_oracle_over_the_contract[no-hidden](" in message[1]
    assert "calling args(case=GatherCase(" in message[1]  # the case drawn with st.data()
    assert message[1].endswith(f"stuck at sleepy_impl.py:{SLEEPY.splitlines().index('        time.sleep(3600)') + 1} "
                               "in gather")
    assert re.search(r"--reproduce-failure \S+:\S+", output), output[-3000:]  # the hanging example, replayable
    # one limit for the whole test, not one per example: the failure came at about 4 s, not 4 s per example
    assert max(_test_seconds(junit).values()) < 4 + 8, _test_seconds(junit)


def test_a_hang_inside_a_state_machine_names_the_rule(tmp_path: Path):
    (tmp_path / "test_machine.py").write_text(MACHINE)
    completed = _pytest(str(tmp_path / "test_machine.py"), "-p", "harness.plugin.timeouts", "--timeout", "3",
                        "--rootdir", str(tmp_path), "-c", os.devnull, cwd=tmp_path)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 1, output[-3000:]
    assert re.search(r"TimeLimitExceeded: test_machine\.py::test_counter::runTest ran past its time limit of 3 s "
                     r"\(--timeout, or @pytest.mark.timeout\) while running the hypothesis example the state machine "
                     r"step Counter\.add\(step=\d\); "
                     r"stuck at test_machine\.py:\d+ in add", output), output[-3000:]


# The limit is waited out in full: 8 s leaves the smoke call room to reach make_runner (building the tiny model
# before it took under 1 s on the 2-core machine under a load of 4) without idling a worker for half a minute.
STARTUP_SECONDS = 8


@pytest.mark.long_running
def test_a_hang_in_the_start_up_smoke_call_is_one_line_usage_error(sleepy: Path):
    started = time.monotonic()
    completed = _pytest("suites/runner", "--impl", "runner=sleepy_runner:make_runner",
                        "--startup-timeout", str(STARTUP_SECONDS))
    assert completed.returncode == 4, completed.stdout + completed.stderr
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, completed.stderr
    assert re.fullmatch(r"ERROR: --impl runner=sleepy_runner:make_runner: loading it \(the import and a smoke call on "
                        rf"a tiny case\) did not finish within {STARTUP_SECONDS} s; stuck at sleepy_runner\.py:6 in "
                        r"make_runner", lines[0]), lines[0]
    assert time.monotonic() - started < STARTUP_SECONDS + 60


def test_the_start_up_limit_nests_inside_a_test_limit(sleepy: Path):
    impls.load("runner", "harness.runner:LayerStackRunner")  # the smoke call's imports, outside the limit below
    started = time.monotonic()
    with pytest.raises(ImplementationError, match=r"did not finish within 3 s; stuck at sleepy_runner.py:6 in "
                                                  r"make_runner"):
        impls.load("runner", "sleepy_runner:make_runner", time_limit=3)
    assert time.monotonic() - started < 3 + 5
    with timeouts.time_limit(30, lambda frame: "outer"):  # an outer limit survives the inner one
        with pytest.raises(timeouts.TimeLimitExceeded, match="inner"), timeouts.time_limit(0.2, lambda frame: "inner"):
            time.sleep(5)
        time.sleep(0.3)


def _sleepy_gather() -> impls.Implementation:
    return impls.Implementation("gather", "sleepy_impl:gather", None, "mutant", "hangs")


def test_a_hanging_selfcheck_child_is_killed_by_its_test_limit(sleepy: Path):
    outcome = selfcheck.run_one(_sleepy_gather(), graph_backend="emulated", device="cpu", root=ROOT,
                                test_timeout=3, process_timeout=240)
    assert outcome.verdict == "killed" and outcome.first_failure.startswith("suites/gather/"), outcome
    assert outcome.seconds < 240


def test_a_selfcheck_child_past_its_process_limit_is_stopped_and_reported(sleepy: Path):
    outcome = selfcheck.run_one(_sleepy_gather(), graph_backend="emulated", device="cpu", root=ROOT,
                                test_timeout=None, process_timeout=6)
    assert outcome.verdict == "timed out" and not outcome.ok, outcome
    assert "process limit of 6 s" in outcome.first_failure
    assert outcome.seconds < 6 + 10
