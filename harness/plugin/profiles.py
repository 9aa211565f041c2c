"""The harness's hypothesis profiles, ``--reproduce-failure``, and per-test example caps.

:data:`HYPOTHESIS_PROFILES`: ``dev`` (local default), ``ci`` (under CI, and the kill matrix's) and
``nightly``; README.md says what each runs. Imported when the harness activates."""

from __future__ import annotations

import os
import re

import hypothesis
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import InvalidArgument

from harness.errors import UsageError
from harness.plugin.child_runs import HYPOTHESIS_STORAGE

__all__ = ["HYPOTHESIS_PROFILES", "apply_reproduce_failure", "capped_examples", "check_reproduce_failure",
           "current_hypothesis_profile", "given_replay", "load_hypothesis_profile", "register_hypothesis_profiles",
           "register_requested_profile"]

HYPOTHESIS_PROFILES = ("dev", "ci", "nightly")


def _profiles() -> dict[str, settings]:
    # On hypothesis's own defaults, not on whatever profile is loaded when they are registered.
    common = dict(parent=settings.get_profile("default"), deadline=None, print_blob=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                         HealthCheck.data_too_large])
    # ci and the kill matrix report the first failing example as found: shrinking re-runs a captured model per
    # step, and the kill matrix needs only "some test fails". dev and nightly shrink.
    no_shrinking = [Phase.explicit, Phase.reuse, Phase.generate]
    # dev is the local loop, where most new examples are a new Inductor compile (README: a first run's time).
    return {
        "dev": settings(max_examples=5, **common),
        "ci": settings(max_examples=25, derandomize=True, database=None, phases=no_shrinking, **common),
        # beside hypothesis's own storage (HYPOTHESIS_STORAGE, which the harness's child runs get), not
        # in the current folder, which is the suites' root (an installed package) in a child run
        "nightly": settings(max_examples=400, database=DirectoryBasedExampleDatabase(
            os.path.join(os.environ.get(HYPOTHESIS_STORAGE) or ".hypothesis", "nightly")), **common),
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


def load_hypothesis_profile(config: pytest.Config) -> None:
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


def check_reproduce_failure(value: str) -> tuple[str, bytes]:
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


def given_replay(config: pytest.Config) -> tuple[str, str] | None:
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
    version, blob = check_reproduce_failure(value)
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

