"""Deprecated alias of :mod:`harness.plugin` (the plugin's module until 0.2; removed in 0.3).

``-p harness.pytest_plugin`` still loads the plugin once; importing ``collect_suite`` from here warns."""

from __future__ import annotations

import warnings
from typing import Any

pytest_plugins = ["harness.plugin"]


def __getattr__(name: str) -> Any:
    if name == "collect_suite":
        warnings.warn("harness.pytest_plugin is deprecated: import collect_suite from harness.plugin",
                      DeprecationWarning, stacklevel=2)
        from harness.plugin import collect_suite

        return collect_suite
    raise AttributeError(f"module 'harness.pytest_plugin' has no attribute {name!r}")
