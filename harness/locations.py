"""Where the suites, goldens and benchmark baselines are, in a checkout or an installed wheel.

Suites are the package ``harness.suites`` (a checkout's ``suites/``); goldens mirror them in ``golden``
beside them; baselines are package data of :mod:`harness.bench`."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

from harness.errors import UsageError

__all__ = ["suites_dir", "project_root", "is_checkout", "package_dir", "state_dir", "baselines_dir",
           "resolve_baseline", "check_writable_file"]

_PACKAGE = Path(__file__).resolve().parent


@functools.cache
def suites_dir() -> Path:
    """The folder of the packaged suites (``suites/`` of a checkout, ``harness/suites`` of a wheel).

    A ``harness`` imported from a checkout has that checkout's suites, even where ``harness.suites`` resolves
    elsewhere: an editable install of another checkout (a git worktree run with ``PYTHONPATH``) maps that name
    to its own folder, whose suites and goldens are not the imported harness's."""
    checkout = _PACKAGE.parent / "suites"
    if (checkout / "__init__.py").is_file() and (_PACKAGE.parent / "pyproject.toml").is_file():
        return checkout
    try:
        spec = importlib.util.find_spec("harness.suites")
    except ImportError:
        spec = None
    if spec is not None and spec.origin:
        return Path(spec.origin).resolve().parent
    if checkout.is_dir():  # a checkout on sys.path without an install
        return checkout
    raise UsageError("cannot find the harness's suites: neither the package harness.suites nor a checkout's "
                     "suites/ folder; reinstall the harness from a checkout: pip wheel --no-deps --wheel-dir dist "
                     "CHECKOUT, then pip install dist/llm_graph_harness-*.whl (or pip install -e CHECKOUT)")


def project_root() -> Path:
    """The folder holding ``suites/`` and ``golden/``: the checkout, or the installed ``harness`` package."""
    return suites_dir().parent


def is_checkout() -> bool:
    """Whether the suites are a source checkout's (writable goldens and kill-matrix hints), not a wheel's."""
    return project_root() != _PACKAGE


def package_dir() -> Path:
    """The folder of the ``harness`` package that is imported (a checkout's ``harness/``, or site-packages')."""
    return _PACKAGE


def state_dir() -> Path:
    """The folder that keeps this machine's state of the harness's runs (hypothesis's ``.hypothesis/`` of the child
    runs, selfcheck's hints cache ``.harness_cache/``): a checkout's root; for an installed harness, the current
    folder (an engine's repository), never the installed package, which every run of the environment shares and the
    next install replaces."""
    return project_root() if is_checkout() else Path.cwd()


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


def check_writable_file(option: str, value: str, *, start: Path) -> None:
    """Refuse, before any work, a path given to ``option`` that a file cannot be written to: a folder, a path under
    a file, or a folder this user cannot write in (missing folders are made when writing). Relative paths are
    from ``start``. The error is one line naming the option and the obstacle."""
    path = start / value
    if path.is_dir():
        raise UsageError(f"{option} {value}: {path} is a folder; name the JSON file to write")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{option} {value}: {path} is not writable")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{option} {value}: {parent} is a file, so nothing can be written under it; "
                         "name a file in a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {value}: the folder {parent} is not writable")
