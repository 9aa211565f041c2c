"""The order the harness gives a collection for pytest-xdist's shares (harness/plugin/xdist_order.py): long
tests at the heads of distinct workers' shares, a same_worker group together at one head, the rest in
collection order, and nothing moved in a collection without the markers or in a run not the harness's."""

from __future__ import annotations

import re

import pytest

from harness.plugin.xdist_order import order_for_workers

pytest_plugins = ["pytester"]

# 12 tests: plain_0..plain_5, two long ones, a rank-pool group of three, one more plain test.
SOURCE = """
import pytest

@pytest.mark.parametrize("n", range(6))
def test_plain(n):
    pass

@pytest.mark.long_running
def test_long_a():
    pass

@pytest.mark.same_worker("pool")
@pytest.mark.parametrize("n", range(3))
def test_pool(n):
    pass

@pytest.mark.long_running
def test_long_b():
    pass

def test_last():
    pass
"""


def _collect(pytester: pytest.Pytester, source: str) -> list[pytest.Item]:
    pytester.makepyfile(test_order=source)
    # syrupy's session hooks need a whole session, which a collection alone does not finish
    items, _ = pytester.inline_genitems("-p", "no:syrupy", "-p", "no:cacheprovider")
    return items


def _names(items) -> list[str]:
    return [item.name for item in items]


@pytest.fixture
def items(pytester: pytest.Pytester) -> list[pytest.Item]:
    collected = _collect(pytester, SOURCE)
    assert len(collected) == 12
    return collected


def test_each_unit_heads_its_own_workers_share(items):
    order_for_workers(items[0].config, items, workers=3)  # shares of 4: places 0, 4 and 8
    names = _names(items)
    assert names[0] == "test_long_a"
    assert names[4:7] == ["test_pool[0]", "test_pool[1]", "test_pool[2]"], names  # together, in their order
    assert names[8] == "test_long_b"
    rest = [name for name in names if not name.startswith(("test_long", "test_pool"))]
    assert rest == [f"test_plain[{n}]" for n in range(6)] + ["test_last"], "the other tests keep their order"
    assert len(set(names)) == 12, "every test once"


def test_more_units_than_workers_queue_at_the_heads_in_turn(items):
    order_for_workers(items[0].config, items, workers=2)  # shares of 6: units 0 and 2 on worker 0
    names = _names(items)
    assert names[:2] == ["test_long_a", "test_long_b"], names
    assert names[6:9] == ["test_pool[0]", "test_pool[1]", "test_pool[2]"], names


def test_without_xdist_the_marked_tests_run_first(items, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    order_for_workers(items[0].config, items)
    assert _names(items)[:5] == ["test_long_a", "test_pool[0]", "test_pool[1]", "test_pool[2]", "test_long_b"]


def test_a_group_longer_than_its_share_runs_on_into_free_places(pytester: pytest.Pytester):
    items = _collect(pytester, SOURCE.replace("range(3)", "range(8)"))  # 17 tests, a group of 8
    order_for_workers(items[0].config, items, workers=4)  # shares of 4: heads at 0, 4, 8, 12
    names = _names(items)
    assert len(names) == len(set(names)) == 17, "every test once"
    assert names[0] == "test_long_a", names
    assert names[4:12] == [f"test_pool[{n}]" for n in range(8)], names  # through the third share's head
    assert names[12] == "test_long_b", names  # the next free place, not inside the group


def test_a_second_call_keeps_the_first_order(items):
    order_for_workers(items[0].config, items, workers=3)
    first = _names(items)
    order_for_workers(items[0].config, items, workers=3)
    assert _names(items) == first


def test_a_collection_without_the_markers_is_untouched(pytester: pytest.Pytester):
    items = _collect(pytester, "def test_a(): pass\ndef test_b(): pass\ndef test_c(): pass\n")
    order_for_workers(items[0].config, items, workers=2)
    assert _names(items) == ["test_a", "test_b", "test_c"]


def test_a_run_that_stops_at_its_first_failure_runs_the_marked_tests_last(pytester: pytest.Pytester):
    pytester.makepyfile(test_order=SOURCE)
    for stop_early in (["-x"], ["--maxfail", "2"]):
        items, _ = pytester.inline_genitems("-p", "no:syrupy", "-p", "no:cacheprovider", *stop_early)
        order_for_workers(items[0].config, items, workers=3)
        assert _names(items) == [f"test_plain[{n}]" for n in range(6)] + ["test_last", "test_long_a"] + [
            f"test_pool[{n}]" for n in range(3)] + ["test_long_b"], (stop_early, _names(items))


def test_a_group_needs_one_name(pytester: pytest.Pytester):
    items = _collect(pytester, "import pytest\n@pytest.mark.same_worker\ndef test_a(): pass\n")
    with pytest.raises(pytest.UsageError, match=r"same_worker takes one group name"):
        order_for_workers(items[0].config, items, workers=2)


def _collected_order(result: pytest.RunResult) -> list[str]:
    return [match[1] for match in map(re.compile(r"::(\w+(?:\[\d+\])?)$").search, result.outlines) if match]


def test_the_plugin_orders_a_harness_run_and_leaves_an_unrelated_run(pytester: pytest.Pytester, monkeypatch):
    pytester.makepyfile(test_order=SOURCE)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    harness_run = pytester.runpytest("--collect-only", "-q", "--device", "cpu", "-p", "no:cacheprovider")
    order = _collected_order(harness_run)
    assert order[0] == "test_long_a" and order[8] == "test_long_b", harness_run.outlines
    unrelated = _collected_order(pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider"))
    assert unrelated[:6] == [f"test_plain[{n}]" for n in range(6)] and unrelated[6] == "test_long_a", unrelated
