"""The rank pool (harness.distributed.rank_pool) and what runs in it: a rank that raises, hangs or dies fails
the step within its deadline, naming every rank's fate; the emulated backend replays collectives on
live values; shard_model refuses what it cannot shard, in one line."""

from __future__ import annotations

import time

import pytest
import rank_pool_checks as checks
import torch

from harness.distributed.rank_pool import RankFailure, RankPool


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, step_timeout=30, grace=5) as pool:
        yield pool


def test_a_step_runs_on_every_rank_in_one_group(pool):
    assert pool.run("sum", checks.rank_and_sum) == [(0, 3.0), (1, 3.0)]


@pytest.mark.parametrize("as_breaks", [False, True], ids=["in-segments", "as-breaks"])
def test_emulated_replay_runs_collectives_on_live_values(pool, as_breaks):
    results = pool.run("replay collectives", checks.replay_collectives, as_breaks)
    live = [torch.arange(6.0).view(3, 2) * (rank + 1) for rank in range(2)]
    reduced = (live[0] + live[1]) * 2  # closed form of all_reduce(x * 2) over both ranks' refilled x
    for rank, result in enumerate(results):
        assert result["breaks"] == (1 if as_breaks else 0)
        assert torch.equal(result["replayed"][0], reduced), f"rank {rank}: {result['replayed'][0]}"
        assert torch.equal(result["replayed"][1], torch.cat([reduced, reduced + 1])), f"rank {rank}"
        for replayed, eager in zip(result["replayed"], result["eager"]):
            assert torch.equal(replayed, eager)
        assert not torch.equal(result["captured"][0], reduced), "the capture-time values are not the live ones"


def test_shard_model_refuses_what_it_cannot_shard_in_one_line(pool):
    messages = pool.run("shard errors", checks.shard_errors)[0]
    assert len(messages) == 3, messages
    assert "vocab_size=95 not divisible by 2" in messages[0]
    assert "dense and MoE" in messages[1]
    assert "collectives='sometimes'" in messages[2]
    assert all("\n" not in message for message in messages)


def test_a_raising_rank_releases_its_blocked_peer(pool):
    started = time.monotonic()
    with pytest.raises(RankFailure) as failure:
        pool.run("raise on rank 1", checks.raise_on_last_rank)
    assert time.monotonic() - started < pool.grace + 5
    fates = failure.value.fates
    assert "rank 1 raised on purpose" in fates[1]
    assert fates[0].startswith("raised"), f"rank 0 was blocked in the all-reduce and must get an error: {fates}"
    assert "step 'raise on rank 1'" in str(failure.value)
    assert pool.run("sum after a failure", checks.rank_and_sum) == [(0, 3.0), (1, 3.0)]


def test_a_hung_rank_fails_the_step_at_its_deadline():
    # The deadline leaves rank 1 room to report "finished" on a loaded machine (the GPU check's tests step
    # runs 12 workers, each with children: 8 s was not enough on a slow host); the bound says the step ended at
    # its deadline, not never.
    with RankPool(2, step_timeout=15, grace=2) as pool:
        started = time.monotonic()
        with pytest.raises(RankFailure) as failure:
            pool.run("collective on rank 0 only", checks.all_reduce_on_rank_zero_only)
        assert time.monotonic() - started < 15 + 2 + 10
        assert failure.value.fates[0].startswith("hung"), failure.value.fates
        assert failure.value.fates[1] == "finished"
        assert "rank 0: hung" in str(failure.value)


def test_a_dying_rank_fails_the_step(pool):
    with pytest.raises(RankFailure) as failure:
        pool.run("die on rank 1", checks.die_on_rank_one)
    assert failure.value.fates[1] == "died (exit code 3) during the step"
    assert pool.run("sum after a death", checks.rank_and_sum)[1] == (1, 3.0)


def test_ranks_exit_when_the_test_process_dies_abruptly():
    """The kill matrix ends a mutant's pytest with os._exit at its first failure, which skips the
    clean-up that terminates daemonic children; orphaned ranks would keep its output pipes open."""
    import os
    import subprocess
    import sys

    code = ("import os\nimport rank_pool_checks as checks\nfrom harness.distributed.rank_pool import RankPool\n"
            "pool = RankPool(2)\npool.run('sum', checks.rank_and_sum)\n"
            "print(' '.join(str(p.pid) for p in pool._processes), flush=True)\nos._exit(1)\n")
    # the child imports this folder's rank_pool_checks, as the rank processes do
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(__file__),
                                                                            os.environ.get("PYTHONPATH")])))
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                               env=environment)
    pids = [int(pid) for pid in completed.stdout.split()]
    assert len(pids) == 2, completed.stdout + completed.stderr
    # Waited for until they are gone; the bound only ends a wait for ranks that never exit (a loaded machine takes
    # seconds to schedule them).
    deadline = time.monotonic() + 120
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in pids if os.path.exists(f"/proc/{pid}") and "Z" not in _state(pid)]
    assert not alive, f"rank processes {alive} outlived their test process"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0]
    except OSError:
        return "Z"
