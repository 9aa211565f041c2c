"""Where the suites, goldens and benchmark baselines are, in a checkout or an installed wheel.

Suites are the package ``harness.suites`` (a checkout's ``suites/``); goldens mirror them in ``golden``
beside them; baselines are package data of :mod:`harness.bench`."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from harness.errors import UsageError

__all__ = ["suites_dir", "project_root", "is_checkout", "baselines_dir", "resolve_baseline"]

_PACKAGE = Path(__file__).resolve().parent


@functools.cache
def suites_dir() -> Path:
    """The folder of the packaged suites (``suites/`` of a checkout, ``harness/suites`` of a wheel)."""
    try:
        spec = importlib.util.find_spec("harness.suites")
    except ImportError:
        spec = None
    if spec is not None and spec.origin:
        return Path(spec.origin).resolve().parent
    checkout = _PACKAGE.parent / "suites"  # a checkout on sys.path without an install
    if checkout.is_dir():
        return checkout
    raise UsageError("cannot find the harness's suites: neither the package harness.suites nor a checkout's "
                     "suites/ folder; reinstall the harness (pip install llm-graph-harness, or pip install -e .)")


def project_root() -> Path:
    """The folder holding ``suites/`` and ``golden/``: the checkout, or the installed ``harness`` package."""
    return suites_dir().parent


def is_checkout() -> bool:
    """Whether the suites are a source checkout's (writable goldens and kill-matrix hints), not a wheel's."""
    return project_root() != _PACKAGE


def baselines_dir() -> Path:
    return _PACKAGE / "bench" / "baselines"


def resolve_baseline(value: str) -> Path:
    """``--baseline`` as given: a file path, else the name of a committed baseline (``emulated-gather``)."""
    path = Path(value)
    if path.is_file():
        return path
    packaged = baselines_dir() / (value if value.endswith(".json") else f"{value}.json")
    if path.name == str(value) and packaged.is_file():
        return packaged
    return path  # read_json names the missing file
