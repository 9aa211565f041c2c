"""The upstream libraries the harness's records depend on: which version is installed, and which record a
version without one of its own is compared with.

A result that depends on an upstream library's code (the transformers zoo's capture and discovery matrices,
torch's compile accounting) is recorded per version of that library. The installed version's own record is
held exactly; a version with none is compared with the nearest record and the differences are reported as
upstream drift (:func:`harness.golden.report_upstream_drift`), never as a failure of the user's run."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Iterable
from pathlib import Path

__all__ = ["UPSTREAM_PACKAGES", "installed_version", "installed_version_text", "parse_version", "version_label",
           "nearest_version", "read_pins", "release_files"]

# The distributions whose releases can move the harness's verdicts or goldens, as pip names them: what the
# run report lists and the drift job upgrades.
UPSTREAM_PACKAGES = ("torch", "transformers", "hypothesis", "syrupy", "pytest", "pytest-xdist")


def parse_version(text: str) -> tuple[int, ...] | None:
    """The release numbers of a version string (``"2.13.0+cpu"`` -> ``(2, 13, 0)``, ``"5.25.0rc1"`` ->
    ``(5, 25, 0)``); None where it starts with no number."""
    match = re.match(r"\d+(?:\.\d+)*", text.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else None


def installed_version_text(package: str) -> str | None:
    """The installed version of ``package`` (a distribution name) as its metadata spells it, read without
    importing it, else its module's ``__version__`` (importable without metadata); None where it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        try:
            return str(importlib.import_module(package.replace("-", "_")).__version__)
        except (ImportError, AttributeError):
            return None


def installed_version(package: str) -> tuple[int, ...] | None:
    """The installed release of ``package`` (:func:`installed_version_text`) as numbers; None where it is not
    installed."""
    text = installed_version_text(package)
    return parse_version(text) if text is not None else None


def version_label(version: Iterable[int]) -> str:
    """``(5, 24, 0)`` -> ``"5.24.0"``."""
    return ".".join(str(part) for part in version)


def nearest_version(version: tuple[int, ...], recorded: Iterable[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The record a version without one of its own is compared with: the newest recorded below it, else the
    oldest above it; None where nothing is recorded."""
    recorded = sorted(set(recorded))
    below = [parts for parts in recorded if parts < tuple(version)]
    if below:
        return below[-1]
    return recorded[0] if recorded else None


def read_pins(path: Path | str) -> dict[str, str]:
    """``{distribution: version}`` of a pip constraints file's ``name==version`` lines (names normalised as
    pip normalises them; comments, markers and other specifiers left out)."""
    pins = {}
    for line in Path(path).read_text().splitlines():
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)", line)
        if match:
            pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return pins


def release_files(folder: Path, *, stem: str, label: str, suffix: str = ".json") -> dict[tuple[int, ...], Path]:
    """The records ``{stem}[{label}X.Y.Z]{suffix}`` in ``folder`` (one golden per release of a library), by
    release."""
    import glob

    found = {}
    for path in folder.glob(f"{glob.escape(f'{stem}[{label}')}*{glob.escape(f']{suffix}')}"):
        parts = parse_version(path.name[len(stem) + len(label) + 1:len(path.name) - len(suffix) - 1])
        if parts is not None and path.name == f"{stem}[{label}{version_label(parts)}]{suffix}":
            found[parts] = path
    return found
