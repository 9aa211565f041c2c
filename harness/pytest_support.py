"""Pytest glue: option handling, implementation selection, hypothesis profiles, reproduction lines.

With :mod:`harness.report`, the only modules of the harness that import pytest; the plugin
(:mod:`harness.pytest_plugin`) wires it in.

The plugin is a ``pytest11`` entry point, so it is loaded by every pytest of an environment where the
harness is installed, an engine's own unit tests too. It declares its options and markers everywhere,
and does everything else (hypothesis profiles, torch's thread count, syrupy's options, the environment,
the ``snapshot`` fixture's extension, the header line, the run report, the time limits) only in a run
that :func:`activate` s it: one given a harness option, or path arguments inside the harness's suites
(at start-up, :func:`wanted_at_start`), or one that collects a suite or a test that uses a harness
fixture (during collection, before any of those modules is imported or test runs).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Callable

import hypothesis
import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import InvalidArgument

from harness import components, impls, locations
from harness.devices import DEVICE_CHOICES, resolve_device, use_one_compile_worker
from harness.errors import HarnessError, UsageError
from harness.graphs import BACKEND_NAMES, GraphBackend, get_backend
from harness.models.transformers_zoo import EXPERTS_IMPLEMENTATIONS, EXPERTS_VARIABLE, experts_implementation

__all__ = [
    "HarnessSession",
    "SESSION_KEY",
    "session_of",
    "current_session",
    "add_options",
    "add_harness_option",
    "add_snapshot_update_placeholder",
    "wanted_at_start",
    "in_suites",
    "uses_harness_fixtures",
    "activate",
    "use_harness_orphan_rule",
    "register_requested_profile",
    "resolve_backend",
    "selected_implementation",
    "implementation_fixtures",
    "reproduce_command",
    "file_node_id",
    "failure_context",
    "annotate_failure",
    "apply_reproduce_failure",
    "register_hypothesis_profiles",
    "HYPOTHESIS_PROFILES",
    "current_hypothesis_profile",
    "SYRUPY_MISSING",
    "capped_examples",
    "TensorParallelSession",
    "tensor_parallel_session",
]


@dataclasses.dataclass(frozen=True)
class HarnessSession:
    """What the options selected, validated once at start-up: kept in ``config.stash[SESSION_KEY]``."""

    device: torch.device
    backend: GraphBackend
    impl_specs: dict[str, str]  # component -> spec, only those given with --impl
    pythonpath: str | None = None  # PYTHONPATH at start-up, through which an --impl module may be found


SESSION_KEY = pytest.StashKey[HarnessSession]()


def session_of(config: pytest.Config) -> HarnessSession:
    """This run's :class:`HarnessSession`, activating the harness if nothing has yet (a harness fixture
    asked for it)."""
    return config.stash[SESSION_KEY] if SESSION_KEY in config.stash else activate(config)


def current_session(config: pytest.Config) -> HarnessSession | None:
    """This run's :class:`HarnessSession`, or None where the harness is not active (an unrelated run)."""
    return config.stash.get(SESSION_KEY, None)


SYRUPY_MISSING = ("golden tests need syrupy, which is not installed in this environment: "
                  "pip install 'syrupy>=5.0' (or reinstall the harness: pip install -e .)")


# Every option of the harness (flag -> default), filled by add_harness_option: one given activates the harness.
_OPTION_DEFAULTS: dict[str, Any] = {}


def add_harness_option(parser: pytest.Parser, *names: str, **attrs: Any) -> None:
    """Add an option to the harness's group; giving it on the command line (or in ``addopts``, or
    ``PYTEST_ADDOPTS``) activates the harness."""
    parser.getgroup("harness", "LLM graph-optimisation harness").addoption(*names, **attrs)
    _OPTION_DEFAULTS[names[0]] = attrs.get("default")


def add_options(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager | None = None) -> None:
    option = functools.partial(add_harness_option, parser)
    option("--device", choices=DEVICE_CHOICES, default="auto",
           help="device for tensors and models (auto: cuda when present)")
    option("--graph-backend", choices=BACKEND_NAMES, default="auto",
           help="graph backend (auto: cuda on a CUDA device, else emulated)")
    option("--impl", action="append", default=[], metavar="COMPONENT=SPEC",
           help="implementation under test, e.g. gather=mypkg.kernels:gather or graphs=mutant:skip-break")
    option("--experts-implementation", choices=EXPERTS_IMPLEMENTATIONS, default=None,
           help="how the transformers zoo's MoE and hybrid stacks run their experts (default: "
                f"${EXPERTS_VARIABLE}, else {EXPERTS_IMPLEMENTATIONS[0]}, what engines capture)")
    option("--tp", type=int, default=2, metavar="N",
           help="ranks of the tensor-parallel suites (suites/runner/tensor_parallel): gloo processes on "
                "the CPU, NCCL with one GPU per rank on cuda; 1 skips them (default 2)")
    option("--startup-timeout", type=float, default=impls.STARTUP_SECONDS, metavar="SECONDS",
           help="time limit on loading each outside --impl (its import and a smoke call on a tiny case) "
                "before any test runs (0: none; default %(default)s); tests have pytest-timeout's --timeout")
    option("--reproduce-failure", metavar="VERSION:BLOB", default=None,
           help="replay one falsifying example of the one selected hypothesis test, as hypothesis's "
                "@reproduce_failure(VERSION, BLOB) would; the reproduce line of a failure gives it")
    if pluginmanager is not None:
        add_snapshot_update_placeholder(parser, pluginmanager)


def add_snapshot_update_placeholder(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """Without syrupy its option would be "unrecognized": accept it, and say what is missing.

    Decided when the harness's options are added, however the plugin came (an entry point, which may load
    before syrupy's, or a checkout's conftest, which loads after every entry point): syrupy will be there
    when it is registered already, or is installed with its pytest11 entry point that is neither blocked
    (``-p no:syrupy``) nor kept from loading (PYTEST_DISABLE_PLUGIN_AUTOLOAD)."""
    if not _syrupy_will_be_registered(pluginmanager):
        parser.getgroup("harness").addoption("--snapshot-update", action="store_true",
                                             help="(needs syrupy, which is not installed)")


def _syrupy_will_be_registered(pluginmanager: pytest.PytestPluginManager) -> bool:
    if pluginmanager.has_plugin("syrupy"):
        return True
    if pluginmanager.is_blocked("syrupy") or os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    import importlib.metadata

    return any(entry.name == "syrupy" for entry in importlib.metadata.entry_points(group="pytest11"))


# The profiles the harness registers (hypothesis adds "default"); README.md says what each is for.
HYPOTHESIS_PROFILES = ("dev", "ci", "selfcheck", "nightly")


def _profiles() -> dict[str, settings]:
    # On hypothesis's own defaults, not on whatever profile is loaded when they are registered.
    common = dict(parent=settings.get_profile("default"), deadline=None, print_blob=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                         HealthCheck.data_too_large])
    # ci and the kill matrix report the first failing example as found, in seconds: shrinking a failure
    # of a captured transformers stack took four minutes on the H200 (each step re-runs the model), and
    # the kill matrix needs only "some test fails". The example is printed with its reproduce blob;
    # dev and nightly shrink.
    no_shrinking = [Phase.explicit, Phase.reuse, Phase.generate]
    # dev is the local loop, and its examples are mostly compiles: each new gather example is a graph that
    # Inductor builds with a C++ compiler (about 2.3 s on a 2-core machine with a cold cache). With 10, a
    # fresh clone's `pytest suites/` took 126 to 137 s there; with 5, 101 s. Under a CI the ci profile runs.
    return {
        "dev": settings(max_examples=5, **common),
        "ci": settings(max_examples=25, derandomize=True, database=None, phases=no_shrinking, **common),
        "selfcheck": settings(max_examples=25, derandomize=True, database=None, phases=no_shrinking, **common),
        "nightly": settings(max_examples=400,
                            database=DirectoryBasedExampleDatabase(os.path.join(".hypothesis", "nightly")), **common),
    }


def register_hypothesis_profiles(*, missing_only: bool = False) -> None:
    """Register the harness's profiles (``ci`` replaces hypothesis's own of that name); with
    ``missing_only``, only those no one has registered."""
    for name, profile in _profiles().items():
        if not (missing_only and _is_registered_profile(name)):
            settings.register_profile(name, profile)


def register_requested_profile(config: pytest.Config) -> None:
    """Where ``--hypothesis-profile`` names a harness profile that nothing has registered (a run the harness
    may only join during collection), register the missing ones, so that hypothesis can load it; a name
    another plugin or conftest registered (hypothesis's own ``ci``) is left as it is until activation."""
    name = config.getoption("hypothesis_profile", None)
    if name in HYPOTHESIS_PROFILES and not _is_registered_profile(name):
        register_hypothesis_profiles(missing_only=True)


def _load_hypothesis_profile(config: pytest.Config) -> None:
    """Register the harness's profiles and load this run's: an explicit ``--hypothesis-profile`` wins (it is
    loaded by hypothesis's own plugin: before, or after when activated at start-up), else
    ``$HYPOTHESIS_PROFILE``, else ``ci`` under a CI and ``dev``."""
    _check_hypothesis_profile(config)
    register_hypothesis_profiles()
    if config.getoption("hypothesis_profile", None):
        return
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def _is_registered_profile(name: str) -> bool:
    try:
        settings.get_profile(name)
    except InvalidArgument:
        return False
    return True


def current_hypothesis_profile() -> str:
    """The name of the hypothesis profile in force."""
    getter = getattr(settings, "get_current_profile_name", None)  # public since hypothesis 6.11x
    return getter() if getter else settings._current_profile  # noqa: SLF001 - older hypothesis only


def _check_hypothesis_profile(config: pytest.Config) -> None:
    """An unknown profile name is a usage error naming where it came from and the known names."""
    for source, name in (("--hypothesis-profile", config.getoption("hypothesis_profile", None)),
                         ("HYPOTHESIS_PROFILE", os.environ.get("HYPOTHESIS_PROFILE"))):
        if name and name not in HYPOTHESIS_PROFILES and not _is_registered_profile(name):
            raise UsageError(f"unknown hypothesis profile {name!r} (from {source}); "
                             f"the harness registers: {', '.join(HYPOTHESIS_PROFILES)}")
        if name:
            return  # the option wins over the variable


_REPLAY_FORMAT = re.compile(r"^(?P<version>[0-9][0-9A-Za-z.+-]*):(?P<blob>[A-Za-z0-9+/=_-]+)$")


def _parse_reproduce_failure(value: str) -> tuple[str, bytes]:
    match = _REPLAY_FORMAT.match(value.strip())
    if match is None:
        raise UsageError(f"--reproduce-failure {value!r}: expected VERSION:BLOB as a failure's reproduce line "
                         f"gives it, for example {hypothesis.__version__}:AAFBCkEAAEEBQQFBAUEA")
    version = match["version"]
    if version != hypothesis.__version__:
        raise UsageError(
            f"--reproduce-failure: the example was recorded with hypothesis {version}, this is "
            f"{hypothesis.__version__}; install hypothesis=={version}, or drop --reproduce-failure to search "
            "again under the same profile and seed (slower: it generates and shrinks anew)")
    return version, match["blob"].encode()


def _given_replay(config: pytest.Config) -> tuple[str, str] | None:
    """The ``--reproduce-failure`` of this session: a replay reports no new blob, so carry this one."""
    value = config.getoption("--reproduce-failure", None)
    if not value:
        return None
    version, _, blob = value.strip().partition(":")
    return version, blob


def apply_reproduce_failure(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put ``@reproduce_failure`` on the one selected test (``--reproduce-failure``).

    A ``@given`` test gets the decorator itself; a test that runs a hypothesis state machine gets
    it on the :class:`~hypothesis.stateful.RuleBasedStateMachine` classes of its module (the
    blob of a stateful failure belongs to the machine).
    """
    value = config.getoption("--reproduce-failure")
    if not value:
        return
    version, blob = _parse_reproduce_failure(value)
    if len(items) != 1:
        raise pytest.UsageError(f"--reproduce-failure replays one test's example, but {len(items)} tests are "
                                "selected: give the one test id of the reproduce line")
    from hypothesis import is_hypothesis_test, reproduce_failure
    from hypothesis.stateful import RuleBasedStateMachine

    item = items[0]
    function = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
    if function is not None and is_hypothesis_test(function):
        reproduce_failure(version, blob)(function)
        return
    module = getattr(item, "module", None)
    machines = [value for value in vars(module).values()
                if isinstance(value, type) and issubclass(value, RuleBasedStateMachine)
                and value.__module__ == module.__name__] if module is not None else []
    if not machines:
        raise pytest.UsageError(f"--reproduce-failure: {item.nodeid} is not a hypothesis test (no @given and no "
                                "state machine in its module)")
    for machine in machines:
        reproduce_failure(version, blob)(machine)


def capped_examples(max_examples: int) -> settings:
    """Per-test settings: at most ``max_examples`` examples, except under ``nightly``, which keeps its
    own count (for tests whose examples cost seconds: real architectures on a CPU)."""
    if current_hypothesis_profile() == "nightly":
        return settings()
    return settings(max_examples=min(max_examples, settings.default.max_examples))


def _set_up_xdist_worker() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    # Workers sharing a few cores must not each start a full intra-op thread pool.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, workers)))
    if torch.cuda.is_available() and torch.cuda.device_count() > 1:
        torch.cuda.set_device(int(worker.removeprefix("gw")) % torch.cuda.device_count())


def resolve_backend(option: str, device: torch.device) -> GraphBackend:
    if option == "cuda" and device.type != "cuda":
        if torch.cuda.is_available():
            device = torch.device("cuda")
        else:
            raise UsageError(
                "--graph-backend cuda was requested but torch sees no CUDA device; use --graph-backend emulated"
            )
    if option == "auto":
        option = "cuda" if device.type == "cuda" else "emulated"
    return get_backend(option, device=device if device.type == "cuda" else None)


def _given_options(config: pytest.Config) -> list[str]:
    """The harness options this run was given: a value other than the default, or the flag itself (an
    explicit ``--device auto`` too) on the command line, in ``PYTEST_ADDOPTS`` or in ``addopts``."""
    words = [str(word) for word in config.invocation_params.args]
    words += [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *config.getini("addopts")]
    return [flag for flag, default in _OPTION_DEFAULTS.items()
            if config.getoption(flag, default) != default
            or any(word == flag or word.startswith(flag + "=") for word in words)]


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
    if _given_options(config):
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
        if module in ("harness.pytest_plugin", __name__):
            return True
    return False


def use_harness_orphan_rule(config: pytest.Config) -> None:
    """One orphan rule, the harness's (:func:`harness.golden.find_orphans`, in :mod:`harness.report`): it knows
    that a test owns all its named goldens, such as the gather's compile accounting for each torch minor
    version. syrupy's own rule would call the other versions' files unused, fail the run on them and delete
    them on ``--snapshot-update``: it is switched off (syrupy reads these options when the session ends)."""
    config.option.disable_unused_snapshots = True
    config.option.warn_unused_snapshots = True


def activate(config: pytest.Config) -> HarnessSession:
    """Start the harness in this run, once: validate its options (a bad one is a usage error, not a failure
    in every test), load its hypothesis profile, set torch's threads, syrupy's options, the environment
    and the ``snapshot`` fixture, and load every ``--impl``. The run report and the time limits act from
    now on. Called before the suites' modules are imported (their ``@settings`` read the profile)."""
    if SESSION_KEY in config.stash:
        return config.stash[SESSION_KEY]
    _set_up_xdist_worker()
    try:
        _load_hypothesis_profile(config)
        if config.getoption("--reproduce-failure"):
            _parse_reproduce_failure(config.getoption("--reproduce-failure"))
        if not config.pluginmanager.has_plugin("syrupy"):
            if config.getoption("--snapshot-update", False):
                raise UsageError(f"--snapshot-update: {SYRUPY_MISSING}")
            config.pluginmanager.register(_SyrupyMissing(), "harness-syrupy-missing")
        else:
            if config.getoption("--snapshot-update", False) and not hasattr(config.option, "disable_unused_snapshots"):
                # syrupy 5 has no switch for its own rule: an update would delete every golden this run does not
                # use, such as the capture matrix of another device and the compile accounting of other torch minors.
                raise UsageError("--snapshot-update needs syrupy 6.0 or newer (the installed one has no "
                                 "--snapshot-disable-unused): syrupy 5 deletes every golden the run does not use, such as "
                                 "those recorded on another device or torch version; upgrade it first: "
                                 "pip install 'syrupy>=6'")
            use_harness_orphan_rule(config)
        # In the environment, so that child processes (kill matrix, subprocess cases) build the same stacks.
        os.environ[EXPERTS_VARIABLE] = experts_implementation(config.getoption("--experts-implementation"))
        device = resolve_device(config.getoption("--device"))
        if device.type == "cpu":
            # The suites run tiny models (hidden sizes 32 to 64) that gain nothing from intra-op
            # threads, while idle threads spinning on a shared CPU cost several times the work
            # (suites/runner: 83 s of CPU time with two threads, 15 s with one, on the 2-core CI-sized
            # machine). Set here, before any fixture builds a model.
            torch.set_num_threads(1)
        use_one_compile_worker(os.environ)  # in this run's child processes too (xdist workers, ranks, probes)
        if config.getoption("--tp", 2) < 1:
            raise UsageError(f"--tp {config.getoption('--tp')}: the number of tensor-parallel ranks must be at least 1")
        backend = resolve_backend(config.getoption("--graph-backend"), device)
        selected = impls.parse_impl_options(config.getoption("--impl"))
        for component, spec in selected.items():
            # fail now, with the reason, rather than in each test
            impls.load(component, spec, graph_backend=backend.name,
                       time_limit=config.getoption("--startup-timeout") or None)
    except HarnessError as error:
        raise pytest.UsageError(str(error)) from None
    session = config.stash[SESSION_KEY] = HarnessSession(device, backend, selected,
                                                         os.environ.get("PYTHONPATH") or None)
    # After every plugin (syrupy among them, in no set order), so that it overrides syrupy's fixture.
    config.pluginmanager.register(_GoldenSnapshot(), "harness-golden-snapshot")
    return session


def selected_implementation(config: pytest.Config, component: str) -> impls.Implementation:
    """The implementation of ``component`` under test: the one ``--impl`` names, else the reference."""
    session = session_of(config)
    return impls.load(component, session.impl_specs.get(component, "reference"), graph_backend=session.backend.name)


def _implementation_fixture(row: components.Component) -> Callable[..., Any]:
    def fixture(pytestconfig: pytest.Config) -> Any:
        implementation = selected_implementation(pytestconfig, row.name).obj
        return implementation(session_of(pytestconfig).backend) if row.binds_backend else implementation

    fixture.__doc__ = (f"The {row.name} implementation under test ({row.summary})"
                       + (", bound to the selected graph backend." if row.binds_backend else "."))
    fixture.__name__ = row.fixture
    return pytest.fixture(scope="session", name=row.fixture)(fixture)


def implementation_fixtures() -> dict[str, Callable[..., Any]]:
    """One session fixture per row of the component table, named by the row's ``fixture``; the root
    plugin publishes them. Each yields what its suites call (a capturer, a factory, a function)."""
    return {row.fixture: _implementation_fixture(row) for row in components.COMPONENTS}


class _GoldenSnapshot:
    @pytest.fixture
    def snapshot(self, snapshot, request: pytest.FixtureRequest):
        """Syrupy's snapshot; for the harness's suites, writing their readable JSON goldens (tensors
        compared within tolerance) in the ``golden/`` folder beside ``suites/``. Other tests of the
        session (an engine's own) keep syrupy's default."""
        from harness.golden import GoldenExtension

        return snapshot.use_extension(GoldenExtension) if in_suites(request.path) else snapshot


class _SyrupyMissing:
    """Stands in for syrupy's plugin when it is not installed: the harness's ``snapshot``
    fixture builds on a ``snapshot`` fixture, and without one pytest reports a recursive dependency."""

    @pytest.fixture
    def snapshot(self) -> None:
        pytest.fail(SYRUPY_MISSING, pytrace=False)


def reproduce_command(config: pytest.Config, nodeid: str, *, replay: tuple[str, str] | None = None,
                      seed: str | None = None) -> str:
    """The command line that reruns test ``nodeid`` as this session ran it, from any directory.

    It starts with ``PYTHONPATH=...`` when that is set and this session's interpreter (``python -m
    pytest``), names the test by absolute path with ``--rootdir`` (so the root conftest and the pytest
    options of the project apply wherever it is run), the device, backend and implementations, the
    hypothesis profile, and, for a hypothesis failure, ``--reproduce-failure VERSION:BLOB`` (replays
    the falsifying example without the local example database, no search, no shrinking) or the
    ``--hypothesis-seed`` that found it. ``nodeid`` may start with the test file's absolute path (see
    :func:`file_node_id`).
    """
    session = session_of(config)
    root = config.rootpath
    path, sep, rest = nodeid.partition("::")
    # The interpreter that ran this session (its environment has the harness and the implementations),
    # and PYTHONPATH, through which an outside --impl module may have been found: pasteable in a new shell.
    prefix = [f"PYTHONPATH={session.pythonpath}"] if session.pythonpath else []
    parts = [sys.executable, "-m", "pytest", f"{root / path}{sep}{rest}", "--rootdir", str(root),
             "--device", session.device.type, "--graph-backend", session.backend.name]
    for component, spec in session.impl_specs.items():
        parts += ["--impl", f"{component}={spec}"]
    if config.getoption("--tp", 2) != 2:
        parts += ["--tp", str(config.getoption("--tp"))]
    parts += ["--hypothesis-profile", current_hypothesis_profile()]
    if experts_implementation() != EXPERTS_IMPLEMENTATIONS[0]:
        parts += ["--experts-implementation", experts_implementation()]
    seed = seed if seed is not None else config.getoption("hypothesis_seed", None)
    if seed is not None:
        parts += ["--hypothesis-seed", str(seed)]
    replay = replay or _given_replay(config)
    if replay is not None:
        parts += ["--reproduce-failure", f"{replay[0]}:{replay[1]}"]
    return " ".join([*map(shlex.quote, prefix), shlex.join(parts)])


def failure_context(request: pytest.FixtureRequest, /, **details: Any) -> dict[str, Any]:
    """Context for :func:`harness.compare.assert_equivalent` failure messages: implementations,
    backend and ``details`` (seed, shapes, ...); the report adds the command that reproduces it."""
    session = session_of(request.config)
    context: dict[str, Any] = {
        "implementations": dict(session.impl_specs) or "reference",
        "backend": session.backend.name,
    }
    context.update(details)
    # No command here: it is written once, complete, in the "reproduce" section that annotate_failure
    # adds to every failed test's report, where hypothesis's falsifying example is known.
    return context


_BLOB = re.compile(r"@reproduce_failure\('(?P<version>[^']+)', b'(?P<blob>[^']+)'\)")
_SEED = re.compile(r"--hypothesis-seed=(?P<seed>-?\d+)")


def _is_golden_mismatch(item: pytest.Item, report: pytest.TestReport) -> bool:
    """Whether a golden assertion of the test failed (a mismatch or a missing snapshot).

    Asked of syrupy's record of the test's snapshot assertions; the crash message is only a fallback,
    since its form depends on the verbosity (``assert [+ received] == [- snapshot]`` at ``-vv``,
    ``AssertionError: assert ...`` below it)."""
    executions = getattr(getattr(item, "funcargs", {}).get("snapshot"), "executions", None)
    if isinstance(executions, dict) and executions:
        return any(not getattr(result, "success", True) for result in executions.values())
    crash = getattr(report.longrepr, "reprcrash", None)
    message = (getattr(crash, "message", "") or "").removeprefix("AssertionError: ")
    return message.startswith("assert") and re.search(r"\bsnapshot\b", message, re.IGNORECASE) is not None


def file_node_id(item: pytest.Item) -> str:
    """The item's node id anchored at its file: the id relative to the rootdir where the file lies in it,
    else the file's absolute path and the names inside it (an installed wheel's suites are outside the
    rootdir, and their node ids relative to the folder they were collected from)."""
    module = item.getparent(pytest.Module)
    if module is None or item.path.resolve().is_relative_to(item.config.rootpath.resolve()):
        return item.nodeid
    return f"{item.path}::{item.nodeid[len(module.nodeid):].lstrip(':')}"


def annotate_failure(item: pytest.Item, report: pytest.TestReport) -> None:
    """Add to a failed test's report the line that reproduces it and, for a golden, how to update it.

    Called from ``pytest_runtest_makereport`` once the report exists, so hypothesis's falsifying
    example (printed as ``@reproduce_failure`` with ``print_blob``) is known.
    """
    if not report.failed or SESSION_KEY not in item.config.stash:
        return
    text = str(report.longrepr)
    blob, seed = _BLOB.search(text), _SEED.search(text)
    nodeid = file_node_id(item)
    command = reproduce_command(item.config, nodeid, seed=seed["seed"] if seed else None,
                                replay=(blob["version"], blob["blob"]) if blob else None)
    sections = [("reproduce", command)]
    if report.when == "call" and "snapshot" in getattr(item, "fixturenames", ()) and _is_golden_mismatch(item, report):
        update = reproduce_command(item.config, nodeid)
        sections.append(("golden", "the output does not match its golden file under golden/. If the change is "
                                   f"intended, rewrite the golden with\n  {update} --snapshot-update\n"
                                   "then review `git diff golden/` and commit the golden with the change; "
                                   "if not, the implementation changed behaviour."))
    for title, content in sections:
        if hasattr(report.longrepr, "addsection"):
            report.longrepr.addsection(title, content)
        else:
            report.sections.append((title, content))


@dataclasses.dataclass
class TensorParallelSession:
    """The rank pool of the tensor-parallel suites and what each rank builds with (the session's
    implementations and graph backend): one per test session, started on first use."""

    pool: Any
    world_size: int
    runner_spec: str
    graphs_spec: str
    graph_backend: str

    def setup(self, **fields: Any) -> Any:
        """A :class:`harness.runner.tensor_parallel.TPSetup` with this session's implementations."""
        from harness.runner.tensor_parallel import TPSetup, warm_up_before_fork

        if fields.get("model") == "moe" and not self.pool.alive and self.pool.start_method == "fork":
            warm_up_before_fork()  # ranks forked after this inherit the compiled MoE combine
        return TPSetup(runner_spec=self.runner_spec, graphs_spec=self.graphs_spec,
                       graph_backend=self.graph_backend, **fields)


def tensor_parallel_session(config: pytest.Config) -> TensorParallelSession:
    """The session's :class:`TensorParallelSession` (``--tp`` ranks: gloo processes on the CPU, NCCL
    with a GPU each on cuda); skips, saying why, where ``--tp 1`` or there are fewer GPUs than ranks.
    The caller closes its pool at the end of the session."""
    from harness.rank_pool import RankPool

    session = session_of(config)
    world_size = config.getoption("--tp")
    if world_size < 2:
        pytest.skip(f"--tp {world_size}: the tensor-parallel cases need at least 2 ranks")
    on_gpus = session.device.type == "cuda" and torch.cuda.device_count() >= world_size
    backend_name = session.backend.name
    if session.device.type == "cuda" and not on_gpus:
        # Rather than skip (a skipped suite would let every distributed mutant survive the kill
        # matrix of a one-GPU runner), run the ranks where they can run, and say so.
        import warnings

        warnings.warn(f"--tp {world_size} on cuda needs {world_size} GPUs (one per NCCL rank) and torch sees "
                      f"{torch.cuda.device_count()}: the tensor-parallel cases run on {world_size} gloo CPU ranks "
                      "with the emulated graph backend instead", stacklevel=1)
        backend_name = "emulated"
    pool = RankPool(world_size, backend="nccl" if on_gpus else "gloo")
    return TensorParallelSession(pool, world_size, session.impl_specs.get("runner", "reference"),
                                 session.impl_specs.get("graphs", "reference"), backend_name)
