"""The harness's activation in a pytest run, and the :class:`HarnessSession` in ``config.stash``.

:func:`activate` runs for a run given a harness option or a suite path (:func:`wanted_at_start`), or one
that collects a suite or a harness fixture; torch and hypothesis load then, not before."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness import impls, locations
from harness.devices import EXPERTS_VARIABLE, experts_implementation, resolve, use_one_compile_worker
from harness.errors import HarnessError, UsageError
from harness.plugin import warning_filters
from harness.plugin.options import GOLDEN_DIR_INI, given_golden_dir, given_options

if TYPE_CHECKING:
    import torch
    from syrupy.assertion import SnapshotAssertion

    from harness.graphs import GraphBackend

__all__ = ["HarnessSession", "SESSION_KEY", "activate", "check_golden_dir", "check_plugin_checkout",
           "current_session", "in_suites", "is_harness_checkout", "session_of", "use_harness_orphan_rule",
           "uses_harness_fixtures", "wanted_at_start"]

_PROJECT = "llm-graph-harness"
# pyproject.toml read with regular expressions (tomllib is Python 3.11+): the [project] table up to the next
# table, and its name, compared as PEP 503 normalises names.
_PROJECT_TABLE = re.compile(r"^\[project\][ \t]*(?:#.*)?$(?P<body>.*?)(?=^[ \t]*\[|\Z)", re.MULTILINE | re.DOTALL)
_PROJECT_NAME = re.compile(r"""^[ \t]*name[ \t]*=[ \t]*(["'])(?P<name>[^"'\n]*)\1""", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class HarnessSession:
    """What the options selected, validated once at start-up: kept in ``config.stash[SESSION_KEY]``."""

    device: torch.device
    backend: GraphBackend
    impl_specs: dict[str, str]  # component -> spec, only those given with --impl
    pythonpath: str | None = None  # PYTHONPATH at start-up, through which an --impl module may be found
    golden_dir: Path | None = None  # an engine's own golden folder (--golden-dir, harness_golden_dir), absolute


SESSION_KEY = pytest.StashKey[HarnessSession]()


def session_of(config: pytest.Config) -> HarnessSession:
    """This run's :class:`HarnessSession`, activating the harness if nothing has yet (a harness fixture
    asked for it)."""
    return config.stash[SESSION_KEY] if SESSION_KEY in config.stash else activate(config)


def current_session(config: pytest.Config) -> HarnessSession | None:
    """This run's :class:`HarnessSession`, or None where the harness is not active (an unrelated run)."""
    return config.stash.get(SESSION_KEY, None)


def is_harness_checkout(folder: Path) -> bool:
    """Whether ``folder`` is a checkout of this project: a ``pyproject.toml`` whose ``[project]`` is named
    llm-graph-harness, and a ``harness/`` folder."""
    try:
        text = (folder / "pyproject.toml").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    table = _PROJECT_TABLE.search(text)
    name = _PROJECT_NAME.search(table["body"]) if table else None
    return (name is not None and re.sub(r"[-_.]+", "-", name["name"]).lower() == _PROJECT
            and (folder / "harness").is_dir())


def check_plugin_checkout(rootdir: Path) -> None:
    """Refuse a run in a checkout of this project whose plugin (and ``harness`` package) lies outside it:
    another checkout's editable install in this environment, or another checkout on ``PYTHONPATH``. The
    run would test the other checkout's code with this one's suites, every test failing on the difference
    (hypothesis health checks, goldens that do not exist) and none saying why."""
    root, package = rootdir.resolve(), locations.package_dir()
    if is_harness_checkout(root) and not package.is_relative_to(root):
        raise UsageError(f"this run's rootdir {root} is a checkout of {_PROJECT}, but the harness plugin and package "
                         f"it loaded are {package}, outside it (another checkout, installed in this environment or on "
                         f"PYTHONPATH): this checkout's code would not be what runs; install this checkout in this "
                         f"environment: pip install -e {root}")


def _set_up_xdist_worker(config: pytest.Config) -> None:
    import torch

    # The worker's own id, not the environment's: a pytest that a worker's test starts inherits the variables
    # without being a worker (the capture matrix's shards once read another run's file that way).
    worker_input = getattr(config, "workerinput", None)
    if worker_input is None:
        return
    worker = str(worker_input["workerid"])
    workers = int(worker_input.get("workercount", os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    # Workers sharing a few cores must not each start a full intra-op thread pool.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, workers)))
    if torch.cuda.is_available() and torch.cuda.device_count() > 1:
        torch.cuda.set_device(int(worker.removeprefix("gw")) % torch.cuda.device_count())


def in_suites(path: os.PathLike[str] | str | None) -> bool:
    """Whether ``path`` lies in the harness's suites (a checkout's ``suites/``, an installed
    ``harness/suites``)."""
    if path is None:
        return False
    try:
        return Path(path).resolve().is_relative_to(locations.suites_dir())
    except HarnessError:
        return False


def wanted_at_start(config: pytest.Config) -> bool:
    """Whether the run asks for the harness before collection: a harness option is given, or a path
    argument lies inside the suites (``pytest suites/``, ``--pyargs harness.suites.gather``).

    A run whose arguments merely contain the suites (``pytest .`` in a checkout) activates it when it
    collects them (:func:`in_suites`), so that a folder pytest does not collect (a virtual
    environment's ``site-packages``) activates nothing."""
    if given_options(config):
        return True
    pyargs = config.getoption("pyargs", False)
    arguments = [str(argument).split("::")[0] for argument in config.args]
    return any(
        (argument == "harness.suites" or argument.startswith("harness.suites.")) if pyargs and "/" not in argument
        else in_suites(Path(config.invocation_params.dir) / argument)
        for argument in arguments)


def uses_harness_fixtures(item: pytest.Item) -> bool:
    """Whether the test uses a fixture of the harness's plugin (``device``, ``gather_function``, ...) rather
    than a fixture of the same name of its own project."""
    info = getattr(item, "_fixtureinfo", None)  # pytest's record of the fixtures the item resolved
    for definitions in getattr(info, "name2fixturedefs", {}).values():
        module = getattr(getattr(definitions[-1], "func", None), "__module__", "") if definitions else ""
        if module.startswith("harness.plugin"):
            return True
    return False


def use_harness_orphan_rule(config: pytest.Config) -> None:
    """One orphan rule, the harness's (:func:`harness.golden.find_orphans`, in :mod:`harness.plugin.report`): it knows
    that a test owns all its named goldens, such as the gather's compile accounting for each torch minor
    version. syrupy's own rule would call the other versions' files unused, fail the run on them and delete
    them on ``--snapshot-update``: it is switched off (syrupy reads these options when the session ends)."""
    config.option.disable_unused_snapshots = True
    config.option.warn_unused_snapshots = True


def check_golden_dir(config: pytest.Config) -> Path | None:
    """The engine's own golden folder in effect (:func:`harness.plugin.options.given_golden_dir`), checked: not a
    file, and, under ``--snapshot-update``, the goldens written never inside an installed harness: a wheel's
    ``harness/golden`` is the harness's, shared by every run of the environment, and replaced by the next install.
    Raises :class:`UsageError` (one line)."""
    folder = given_golden_dir(config)
    source = "--golden-dir" if config.getoption("--golden-dir", None) else GOLDEN_DIR_INI
    if folder is not None and folder.exists() and not folder.is_dir():
        raise UsageError(f"{source} {folder}: not a folder; name the folder that holds (or will hold) your goldens")
    if config.getoption("--snapshot-update", False) and not locations.is_checkout():
        packaged = locations.project_root()
        if folder is None or folder.is_relative_to(packaged):
            where = packaged / "golden" if folder is None else folder
            raise UsageError(
                f"--snapshot-update would write the goldens into the installed harness ({where}); keep goldens of "
                f"your own: add --golden-dir=PATH (e.g. --golden-dir=tests/harness-goldens), or {GOLDEN_DIR_INI} = "
                "PATH in your pytest ini, record them with --snapshot-update and commit them")
    return folder


def activate(config: pytest.Config) -> HarnessSession:
    """Start the harness in this run, once: validate its options (a bad one is a usage error, not a failure
    in every test), load its hypothesis profile, set torch's threads, syrupy's options, the environment
    and the ``snapshot`` fixture, and load every ``--impl``. The run report and the time limits act from
    now on. Called before the suites' modules are imported (their ``@settings`` read the profile)."""
    if SESSION_KEY in config.stash:
        return config.stash[SESSION_KEY]
    with warning_filters.filtered():  # what torch warns of while the harness imports it and loads the --impl
        return _activate(config)


def _activate(config: pytest.Config) -> HarnessSession:
    try:
        check_plugin_checkout(config.rootpath)
    except HarnessError as error:
        raise pytest.UsageError(str(error)) from None
    import torch

    from harness.graphs import backend_for
    from harness.hazards import AMPLIFIERS_VARIABLE
    from harness.plugin import profiles

    _set_up_xdist_worker(config)
    try:
        profiles.load_hypothesis_profile(config)
        if config.getoption("--reproduce-failure"):
            profiles.check_reproduce_failure(config.getoption("--reproduce-failure"))
        if config.getoption("--harness-report", None):
            locations.check_writable_file("--harness-report", config.getoption("--harness-report"),
                                          start=Path(config.invocation_params.dir))
        if config.getoption("--snapshot-update", False) and not hasattr(config.option, "disable_unused_snapshots"):
            # syrupy 5 has no switch for its own rule: an update would delete every golden this run does not
            # use, such as the capture matrix of another device and the compile accounting of other torch minors.
            raise UsageError("--snapshot-update needs syrupy 6.0 or newer (the installed one has no "
                             "--snapshot-disable-unused): syrupy 5 deletes every golden the run does not use, such as "
                             "those recorded on another device or torch version; upgrade it first: "
                             "pip install 'syrupy>=6'")
        golden_dir = check_golden_dir(config)
        use_harness_orphan_rule(config)
        # In the environment, so that child processes (kill matrix, subprocess cases) build the same stacks.
        os.environ[EXPERTS_VARIABLE] = experts_implementation(config.getoption("--experts-implementation"))
        os.environ[AMPLIFIERS_VARIABLE] = config.getoption("--hazard-amplifiers")
        placement = resolve(device=config.getoption("--device"), graph_backend=config.getoption("--graph-backend"))
        if placement.device_type == "cpu":
            # The suites' tiny models gain nothing from intra-op threads, and idle threads spinning on a shared
            # CPU cost several times the work. Set before any fixture builds a model.
            torch.set_num_threads(1)
        use_one_compile_worker(os.environ)  # in this run's child processes too (xdist workers, ranks, probes)
        if config.getoption("--tp", 2) < 1:
            raise UsageError(f"--tp {config.getoption('--tp')}: the number of tensor-parallel ranks must be at least 1")
        backend = backend_for(placement)
        selected = impls.parse_impl_options(config.getoption("--impl"))
        for component, spec in selected.items():
            # fail now, with the reason, rather than in each test
            impls.load(component, spec, graph_backend=backend.name,
                       time_limit=config.getoption("--startup-timeout") or None)
    except HarnessError as error:
        raise pytest.UsageError(str(error)) from None
    session = config.stash[SESSION_KEY] = HarnessSession(placement.device, backend, selected,
                                                         os.environ.get("PYTHONPATH") or None, golden_dir)
    # After every plugin (syrupy among them, in no set order), so that it overrides syrupy's fixture; where syrupy
    # is not loaded (autoloading off, no -p syrupy) an override would make pytest report a recursive dependency.
    if config.pluginmanager.has_plugin("syrupy"):
        config.pluginmanager.register(_GoldenSnapshot(), "harness-golden-snapshot")
    return session


class _GoldenSnapshot:
    @pytest.fixture
    def snapshot(self, snapshot: SnapshotAssertion, request: pytest.FixtureRequest) -> SnapshotAssertion:
        """Syrupy's snapshot; for the harness's suites, writing their readable JSON goldens (tensors
        compared within tolerance) in the ``golden/`` folder beside ``suites/``, or in the engine's own folder
        (``--golden-dir``, ``harness_golden_dir``). Other tests of the session (an engine's own) keep syrupy's
        default."""
        from harness.golden import GoldenExtension

        return snapshot.use_extension(GoldenExtension) if in_suites(request.path) else snapshot
