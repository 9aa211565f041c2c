"""The harness's own tests: what a run of them needs beyond the harness's plugin and the root ``conftest.py``.

``@pytest.mark.long_running`` (the harness's marker, :mod:`harness.plugin.xdist_order`) marks a test that runs a
whole suite, a benchmark or a chain of child processes (tens of seconds here, more on a GPU runner): it
starts first, at the head of its own xdist worker's share (the GPU check's tests step had stopped at its
limit waiting for one started last).
"""

from __future__ import annotations

import pytest

from harness.plugin.xdist_order import order_for_workers


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a run of tests/ that the harness's plugin did not activate for: its order all the same
    order_for_workers(config, items)
