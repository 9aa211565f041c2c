"""Golden snapshots (syrupy) as readable JSON, tensors compared within their dtype's tolerance.

Safe to use: :class:`GoldenExtension` (the ``snapshot`` fixture's extension), :func:`assert_upstream_golden`,
:func:`report_upstream_drift`, :func:`golden_root`, :func:`drift_events` and :func:`find_orphans`. The README's
Goldens section states the
matching and update rules, and where an engine keeps goldens of its own (``--golden-dir``)."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import os
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from harness.compare import tolerance_for
from harness.errors import GoldenError

__all__ = [
    "GoldenExtension",
    "DriftEvent",
    "to_golden",
    "tensor_summary",
    "golden_matches",
    "merge_golden",
    "device_class",
    "configure_goldens",
    "drift_events",
    "find_orphans",
    "golden_root",
    "assert_upstream_golden",
    "report_upstream_drift",
]

_TENSOR_KEY = "__tensor__"
_HEAD = 8  # leading values stored per tensor: enough to spot a shifted or permuted result


@dataclasses.dataclass(frozen=True)
class DriftEvent:
    """A golden that moved: bits within tolerance, no digest for this class yet, or a real change."""

    golden: str  # the file
    where: str  # the tensor's path inside it
    device_class: str
    # "bits changed within tolerance", "no digest for this device class", "changed beyond tolerance"
    # (the test fails), "rewritten by --snapshot-update", or "upstream drift: ..." (report_upstream_drift)
    kind: str
    differences: tuple[str, ...] = ()  # upstream drift: what differs from the nearest record (- record, + now)
    record: str = ""  # upstream drift: how to record the installed version's own


@dataclasses.dataclass
class _Session:
    device_class: str = "cpu"
    update: bool = False
    # node id -> the command that reruns it (the plugin's reproduce line), for the record commands of upstream drift
    rerun: Callable[[str], str] = lambda nodeid: f"pytest {nodeid}"
    golden_dir: Path | None = None  # an engine's own golden folder (--golden-dir), else None: golden/ beside suites/
    events: list[DriftEvent] = dataclasses.field(default_factory=list)


_SESSION = _Session()


def device_class(device: torch.device | str) -> str:
    """``cpu``, or ``cuda-sm<major><minor>``: devices of one class should give the same bits."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    major, minor = torch.cuda.get_device_capability(device)
    return f"cuda-sm{major}{minor}"


def configure_goldens(*, device_class: str, update: bool, golden_dir: Path | None = None,
                      rerun: Callable[[str], str] | None = None) -> None:
    """Called once per pytest process: the class whose digests this run checks, update mode, the folder of
    an engine's own goldens (``--golden-dir``: absolute; None for the ``golden/`` folder beside ``suites/``),
    and ``rerun(nodeid)``, the command that reruns a test as this session ran it."""
    _SESSION.device_class, _SESSION.update, _SESSION.golden_dir = device_class, update, golden_dir
    _SESSION.rerun = rerun or _Session.rerun
    _SESSION.events.clear()


def golden_root(test_file: os.PathLike[str] | str) -> Path:
    """The folder holding the goldens of the test module ``test_file``, mirroring the suites below it.

    The engine's own folder when one is configured (``--golden-dir`` or the ini's ``harness_golden_dir``),
    else the ``golden/`` folder beside the ``suites/`` folder the module lies in (a checkout's, or an
    installed wheel's ``harness/golden``); a module outside any ``suites/`` keeps its goldens in a
    ``golden/`` folder next to it, whatever is configured."""
    split = _split_at_suites(Path(test_file))
    if split is None:
        return Path(test_file).parent / "golden"
    if _SESSION.golden_dir is not None:
        return _SESSION.golden_dir
    return split[0] / "golden"


def _split_at_suites(test_file: Path) -> tuple[Path, Path] | None:
    """The folder holding the innermost ``suites/`` above ``test_file``, and the module's folder below it
    (``gather``, ``runner/architectures``); None for a module outside any ``suites/``."""
    parts = test_file.parts
    if "suites" not in parts[:-1]:
        return None
    index = len(parts) - 2 - parts[-2::-1].index("suites")
    return Path(*parts[:index]), Path(*parts[index + 1:-1])


def drift_events() -> list[DriftEvent]:
    """Goldens of this process whose bits moved within tolerance, or that lack this class's digest."""
    return list(_SESSION.events)


def _quantum(value: float, dtype_name: str) -> float:
    """The decimal step below which the tolerance cannot tell values apart (0: store exactly)."""
    tol = tolerance_for(getattr(torch, dtype_name, torch.float64))
    allowed = tol.atol + tol.rtol * abs(value)
    if allowed <= 0 or not math.isfinite(value):
        return 0.0
    # A tenth of the tolerance, down to a power of ten: rounding costs at most 5% of it.
    return 10.0 ** math.floor(math.log10(allowed / 10))


def _rounded(value: float, dtype_name: str) -> float | str:
    if not math.isfinite(value):
        return repr(value)
    step = _quantum(value, dtype_name)
    if step == 0.0:
        return value
    decimals = max(0, -int(round(math.log10(step))))
    result = round(value, decimals) if decimals else float(round(value / step) * step)
    return result + 0.0  # no "-0.0" in a file


def tensor_summary(tensor: torch.Tensor, *, device_kind: str | None = None) -> dict[str, Any]:
    """Shape, dtype, rounded statistics (in float64), first values and a sha256 of the raw bits."""
    data = tensor.detach().cpu().contiguous()
    dtype_name = str(data.dtype).removeprefix("torch.")
    values = data.to(torch.float64).flatten() if data.numel() else torch.zeros(0, dtype=torch.float64)
    stats = {}
    if values.numel():
        stats = {
            "mean": float(values.mean()),
            "abs_mean": float(values.abs().mean()),
            "rms": float(values.pow(2).mean().sqrt()),
            "min": float(values.min()),
            "max": float(values.max()),
        }
    digest = hashlib.sha256(data.view(torch.uint8).numpy().tobytes()).hexdigest() if data.numel() else ""
    return {
        _TENSOR_KEY: {
            "shape": list(data.shape),
            "dtype": dtype_name,
            "stats": {key: _rounded(value, dtype_name) for key, value in stats.items()},
            "head": [_rounded(float(v), dtype_name) for v in values[:_HEAD]],
            "sha256": {device_kind or _SESSION.device_class: digest},
        }
    }


PropertyFilter = Callable[..., bool]
PropertyMatcher = Callable[..., Any]


def to_golden(value: Any, *, exclude: PropertyFilter | None = None, include: PropertyFilter | None = None,
              matcher: PropertyMatcher | None = None, _path: tuple = ()) -> Any:
    """Plain JSON data for ``value``: tensors summarised, dataclasses as dicts, enums as values.

    ``exclude``, ``include`` and ``matcher`` are syrupy's property hooks (``syrupy.filters.props``,
    ``paths``, ``syrupy.matchers.path_type``): called with the property name and its path of
    ``(name, type)`` pairs, as syrupy's own serializers call them.
    """
    if matcher is not None:
        value = matcher(data=value, path=_path)
    options = dict(exclude=exclude, include=include, matcher=matcher)
    if isinstance(value, torch.Tensor):
        return tensor_summary(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        result = {}
        for key, item in value.items():
            if exclude is not None and exclude(prop=key, path=_path):
                continue
            if include is not None and not include(prop=key, path=_path):
                continue
            result[str(key)] = to_golden(item, **options, _path=(*_path, (key, type(item))))
        return result
    if isinstance(value, (list, tuple)):
        return [to_golden(item, **options, _path=(*_path, (index, type(item))))
                for index, item in enumerate(value)
                if not (exclude is not None and exclude(prop=index, path=_path))]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, torch.nn.Module):
        return type(value).__name__
    if type(value).__name__ == "Repr":  # what syrupy's path_type matcher puts in place of a value
        return str(value)
    raise TypeError(f"cannot store a {type(value).__name__} in a golden; convert it to plain data first")


def _close(actual: Any, expected: Any, dtype_name: str) -> bool:
    if isinstance(actual, str) or isinstance(expected, str):  # inf / nan stored as their repr
        return actual == expected
    tol = tolerance_for(getattr(torch, dtype_name, torch.float64))
    # Both sides were rounded to the quantum: allow one step on top of the tolerance.
    slack = _quantum(expected, dtype_name)
    return actual == expected or abs(actual - expected) <= tol.atol + tol.rtol * abs(expected) + slack


def _tensor_values_match(actual: dict[str, Any], expected: dict[str, Any]) -> bool:
    if actual["shape"] != expected["shape"] or actual["dtype"] != expected["dtype"]:
        return False
    if set(actual["stats"]) != set(expected["stats"]) or len(actual["head"]) != len(expected["head"]):
        return False
    pairs = [(actual["stats"][k], expected["stats"][k]) for k in expected["stats"]]
    pairs += list(zip(actual["head"], expected["head"]))
    return all(_close(a, e, expected["dtype"]) for a, e in pairs)


def _walk_tensors(actual: Any, expected: Any, where: str,
                  visit: Callable[[str, dict[str, Any], dict[str, Any]], bool]) -> bool:
    """Exact comparison of plain data; ``visit`` decides each pair of tensor summaries."""
    if isinstance(expected, dict) and _TENSOR_KEY in expected:
        return (isinstance(actual, dict) and _TENSOR_KEY in actual
                and visit(where, actual[_TENSOR_KEY], expected[_TENSOR_KEY]))
    if isinstance(expected, dict):
        return isinstance(actual, dict) and set(actual) == set(expected) and all(
            _walk_tensors(actual[k], expected[k], f"{where}.{k}" if where else k, visit) for k in expected)
    if isinstance(expected, list):
        return isinstance(actual, list) and len(actual) == len(expected) and all(
            _walk_tensors(a, e, f"{where}[{i}]", visit) for i, (a, e) in enumerate(zip(actual, expected)))
    return type(actual) is type(expected) and actual == expected


def golden_matches(actual: Any, expected: Any) -> bool:
    """Exact for plain data; tensors (``{"__tensor__": ...}``) within their dtype's tolerance."""
    return _walk_tensors(actual, expected, "", lambda _, a, e: _tensor_values_match(a, e))


def _digests(summary: Mapping[str, Any]) -> dict[str, str]:
    digest = summary.get("sha256", {})
    return dict(digest) if isinstance(digest, Mapping) else {}


def merge_golden(new: Any, old: Any) -> Any:
    """What ``--snapshot-update`` writes: ``new``, except that a tensor within tolerance of its old
    summary keeps the old numbers and digests (adding the digests ``new`` brings for its class)."""
    if isinstance(new, dict) and _TENSOR_KEY in new:
        if isinstance(old, dict) and _TENSOR_KEY in old and _tensor_values_match(new[_TENSOR_KEY], old[_TENSOR_KEY]):
            kept = dict(old[_TENSOR_KEY])
            kept["sha256"] = {**_digests(old[_TENSOR_KEY]), **_digests(new[_TENSOR_KEY])}
            return {_TENSOR_KEY: kept}
        return new  # changed beyond tolerance: the other classes' digests describe the old numbers
    if isinstance(new, dict):
        old = old if isinstance(old, dict) else {}
        return {key: merge_golden(value, old.get(key)) for key, value in new.items()}
    if isinstance(new, list):
        old = old if isinstance(old, list) and len(old) == len(new) else [None] * len(new)
        return [merge_golden(a, b) for a, b in zip(new, old)]
    return new


def _differences(actual: Any, expected: Any, where: str) -> Iterator[str]:
    label = where or "(root)"
    if isinstance(expected, dict) and _TENSOR_KEY in expected and isinstance(actual, dict) and _TENSOR_KEY in actual:
        new, old = actual[_TENSOR_KEY], expected[_TENSOR_KEY]
        for key in ("shape", "dtype"):
            if new[key] != old[key]:
                yield f"{label}.{key}: - {old[key]}  + {new[key]}"
        if new["shape"] != old["shape"] or new["dtype"] != old["dtype"]:
            return
        tol = tolerance_for(getattr(torch, old["dtype"], torch.float64))
        pairs = [(f"stats.{k}", new["stats"].get(k), old["stats"][k]) for k in old["stats"]]
        pairs += [(f"head[{i}]", a, e) for i, (a, e) in enumerate(zip(new["head"], old["head"]))]
        for name, a, e in pairs:
            if a is None or not _close(a, e, old["dtype"]):
                far = f" (|diff| {abs(a - e):.3g}, allowed {tol.atol + tol.rtol * abs(e):.3g} for {old['dtype']})" \
                    if isinstance(a, (int, float)) and isinstance(e, (int, float)) else ""
                yield f"{label}.{name}: - {e}  + {a}{far}"
    elif isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual)):
            inner = f"{where}.{key}" if where else key
            if key not in actual:
                yield f"{inner}: - {json.dumps(expected[key])}  + (missing)"
            elif key not in expected:
                yield f"{inner}: - (missing)  + {json.dumps(actual[key])}"
            else:
                yield from _differences(actual[key], expected[key], inner)
    elif isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        for i, (a, e) in enumerate(zip(actual, expected)):
            yield from _differences(a, e, f"{where}[{i}]")
    elif type(actual) is not type(expected) or actual != expected:
        yield f"{label}: - {json.dumps(expected)}  + {json.dumps(actual)}"


def _parse(text: str, location: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:
        raise GoldenError(
            f"golden file {location} is not valid JSON ({error}): it is corrupted or truncated; restore it "
            "with `git checkout -- <file>`, or delete it and regenerate with --snapshot-update") from None


def _dump(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


class GoldenExtension(SingleFileSnapshotExtension):
    """Syrupy extension: JSON text files under ``golden/`` (or the engine's own folder, :func:`golden_root`),
    tolerance-aware for tensors.

    Safe to override: :meth:`dirname` (where files go) and :meth:`serialize` (what is stored).
    """

    _write_mode = WriteMode.TEXT
    file_extension = "json"

    @classmethod
    def dirname(cls, *, test_location: Any) -> str:
        test_file = Path(test_location.filepath)
        split = _split_at_suites(test_file)  # a test outside suites/ keeps its goldens next to it
        inner = split[1] if split is not None else Path()
        return str(golden_root(test_file) / inner / test_location.basename)

    def serialize(self, data: Any, *, exclude: PropertyFilter | None = None, include: PropertyFilter | None = None,
                  matcher: PropertyMatcher | None = None, **_: Any) -> str:
        return _dump(to_golden(data, exclude=exclude, include=include, matcher=matcher))

    def read_snapshot_data_from_location(self, *, snapshot_location: str, **kwargs: Any) -> Any:
        text = super().read_snapshot_data_from_location(snapshot_location=snapshot_location, **kwargs)
        if text is not None:
            _parse(text, snapshot_location)  # fail here, naming the file, not deep inside a comparison
        self._last_location = snapshot_location  # matches() is called next, for this file
        return text

    def matches(self, *, serialized_data: Any, snapshot_data: Any) -> bool:
        location = getattr(self, "_last_location", "golden")
        actual, expected = json.loads(serialized_data), _parse(snapshot_data, location)
        events: list[DriftEvent] = []
        kind = _SESSION.device_class

        def visit(where: str, new: dict[str, Any], old: dict[str, Any]) -> bool:
            if not _tensor_values_match(new, old):
                return False
            recorded, current = _digests(old).get(kind), _digests(new).get(kind)
            if recorded is None:
                events.append(DriftEvent(location, where or "(root)", kind, "no digest for this device class"))
            elif recorded != current:
                events.append(DriftEvent(location, where or "(root)", kind, "bits changed within tolerance"))
            return True

        if not _walk_tensors(actual, expected, "", visit):
            kind_of_change = "rewritten by --snapshot-update" if _SESSION.update else "changed beyond tolerance"
            _SESSION.events.append(DriftEvent(location, "(file)", kind, kind_of_change))
            return False
        missing = [event for event in events if event.kind.startswith("no digest")]
        if _SESSION.update and missing:
            _SESSION.events.append(DriftEvent(location, "(file)", kind, "digest recorded for this device class"))
            return False  # rewrite only to add this class's digests (merge_golden keeps the numbers)
        _SESSION.events.extend(events)
        return True

    def diff_lines(self, serialized_data: Any, snapshot_data: Any) -> Iterator[str]:
        """What changed, one line per value: numbers beyond tolerance with how far, plain data exactly."""
        try:
            actual, expected = json.loads(serialized_data), json.loads(snapshot_data)
        except (TypeError, ValueError):
            yield from super().diff_lines(serialized_data, snapshot_data)
            return
        lines = list(_differences(actual, expected, ""))
        where = os.path.relpath(getattr(self, "_last_location", "."))
        yield f"golden {where}: {len(lines)} difference(s) (- golden, + now)"
        yield from lines[:40]
        if len(lines) > 40:
            yield f"... and {len(lines) - 40} more"

    @classmethod
    def write_snapshot_collection(cls, *, snapshot_collection: Any, **kwargs: Any) -> None:
        location = Path(snapshot_collection.location)
        snapshot = next(iter(snapshot_collection))
        if location.is_file():
            try:
                old = json.loads(location.read_text())
            except ValueError:
                old = None  # an unreadable golden being replaced on purpose
            if old is not None:
                merged = _dump(merge_golden(json.loads(snapshot.data), old))
                snapshot_collection.add(dataclasses.replace(snapshot, data=merged))
        super().write_snapshot_collection(snapshot_collection=snapshot_collection, **kwargs)


def _file_stem(test_name: str) -> str:
    """The file name syrupy's single-file extensions give a test: path and control characters dropped."""
    return "".join(c for c in test_name if c not in '\\/?*:|"<>' and not unicodedata.category(c).startswith("C"))


def _snapshot_names_used(test_names: Iterable[str]) -> Callable[[str], bool]:
    names = {_file_stem(name) for name in test_names}
    # syrupy names a test's second and later snapshots "<test>.<index>", a named one "<test>[<name>]".
    return lambda stem: stem in names or any(stem.startswith((name + ".", name + "[")) for name in names)


def _nodeid(test_location: Any) -> str:
    """A syrupy test location's node id anchored at its file's absolute path (runnable from any folder)."""
    return f"{test_location.filepath}::{test_location.nodeid.split('::', 1)[1]}"


def report_upstream_drift(*, record: str, where: str, nodeid: str, package: str, installed: tuple[int, ...],
                          compared_with: tuple[int, ...], differences: Iterable[str], how: str = "") -> None:
    """Report that ``package``'s installed version has no record of its own in ``record`` (a file): the
    test compared with ``compared_with``'s and passes; ``differences`` (- record, + now) and the command that
    records the installed version's own (``nodeid`` rerun with ``--snapshot-update``, then ``how``, where
    more than the update is needed) go to the run report as upstream drift."""
    from harness.upstream import version_label

    differences = tuple(differences)
    verdict = f"{len(differences)} difference(s)" if differences else "no difference"
    command = f"{_SESSION.rerun(nodeid)} --snapshot-update" + (f"; then {how}" if how else "")
    _SESSION.events.append(DriftEvent(
        record, where, _SESSION.device_class,
        f"upstream drift: {package} {version_label(installed)} has no record of its own; against "
        f"{version_label(compared_with)}'s, {verdict}", differences, command))


def assert_upstream_golden(snapshot: Any, actual: Any, *, package: str, prefix: str = "", precision: int = 3,
                           version: tuple[int, ...] | None = None) -> None:
    """Compare ``actual``, a result that depends on ``package``'s code, with its golden for the installed
    version of ``package`` (the snapshot ``{prefix}{package}-{X.Y.Z}``, cut to ``precision`` numbers).

    The installed version's own golden is compared as any golden is, and so is a run with
    ``--snapshot-update`` (which records it). A version without one is compared with the nearest recorded
    version (:func:`harness.upstream.nearest_version`): the test passes, and what differs is reported as
    upstream drift, with the command that records it. With nothing recorded, syrupy reports the missing golden.
    """
    from harness.upstream import installed_version, nearest_version, release_files, version_label

    __tracebackhide__ = True  # a failure shows the test's line and syrupy's diff, not this function
    version = tuple(version if version is not None else installed_version(package) or ())[:precision]
    label = f"{prefix}{package}-"
    own = label + version_label(version)
    location = Path(snapshot.extension.get_location(test_location=snapshot.test_location, index=own))
    marker = f"[{own}]"
    head, tail = location.name.split(marker) if marker in location.name else (location.stem, "")
    recorded = release_files(location.parent, stem=head, label=label, suffix=tail)
    chosen = nearest_version(version, recorded)
    if _SESSION.update or location.is_file() or chosen is None:
        assert actual == snapshot(name=own)
        return
    expected = _parse(recorded[chosen].read_text(), str(recorded[chosen]))
    now = json.loads(_dump(to_golden(actual)))
    differences = [] if golden_matches(now, expected) else list(_differences(now, expected, ""))
    report_upstream_drift(record=str(recorded[chosen]), where=own, nodeid=_nodeid(snapshot.test_location),
                          package=package, installed=version, compared_with=chosen, differences=differences)


def find_orphans(*, root: Path, collected: Mapping[str, Iterable[str]], scopes: Iterable[str],
                 golden_dir: Path | None = None) -> list[Path]:
    """Golden files no test owns, within the suite folders or modules that were run.

    ``collected`` maps a test module (``suites/runner/test_goldens.py``, relative to ``root``) to
    the names of its collected tests (before any ``-k`` deselection); ``scopes`` are the suite
    folders or modules given on the command line. A golden is an orphan when its module is gone
    from a folder in scope, or its module was collected and has no test of that name. ``golden_dir``: the
    folder of the goldens in effect, when not ``root / "golden"`` (an engine's own, ``--golden-dir``).
    """
    goldens, suites_root = golden_dir or root / "golden", root / "suites"
    orphans: list[Path] = []
    modules = {Path(module).with_suffix(""): _snapshot_names_used(names) for module, names in collected.items()}
    for scope in sorted(set(scopes)):
        relative = Path(scope).relative_to("suites") if Path(scope).parts[:1] == ("suites",) else None
        if relative is None:
            continue
        folder = goldens / relative.with_suffix("") if scope.endswith(".py") else goldens / relative
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*.json")):
            if not path.parent.name.startswith("test_"):
                continue  # not a snapshot (those live in a folder per test module): e.g. selfcheck's kill matrix
            module_dir = path.parent.relative_to(goldens)  # runner/test_goldens
            module = Path("suites") / module_dir
            if not (suites_root / module_dir).with_suffix(".py").is_file():
                orphans.append(path)  # the test module was deleted or renamed
            elif module in modules and not modules[module](path.stem):
                orphans.append(path)
    return sorted(set(orphans))


