"""The harness's pytest options; giving any of them activates the harness in a run.

Declaring them imports neither torch nor hypothesis (the choices come from :mod:`harness.devices`)."""

from __future__ import annotations

import functools
import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from harness import impls
from harness.devices import BACKEND_CHOICES, DEVICE_CHOICES, EXPERTS_IMPLEMENTATIONS, EXPERTS_VARIABLE

__all__ = ["GOLDEN_DIR_INI", "add_harness_option", "add_ini_settings", "add_options", "given_golden_dir",
           "given_options", "path_options", "refuse_separate_path_values"]

# Every option of the harness (flag -> default), filled by add_harness_option: one given activates the harness.
_OPTION_DEFAULTS: dict[str, Any] = {}
# The options whose value is a path (metavar PATH), filled by add_harness_option: their value must be joined to them.
_PATH_OPTIONS: dict[str, None] = {}
# The ini setting naming an engine's own golden folder (``--golden-dir`` wins over it).
GOLDEN_DIR_INI = "harness_golden_dir"


def add_harness_option(parser: pytest.Parser, *names: str, **attrs: Any) -> None:
    """Add an option to the harness's group; giving it on the command line (or in ``addopts``, or
    ``PYTEST_ADDOPTS``) activates the harness. An option whose ``metavar`` is ``PATH`` takes its value joined to it
    (:func:`refuse_separate_path_values`)."""
    parser.getgroup("harness", "LLM graph-optimisation harness").addoption(*names, **attrs)
    _OPTION_DEFAULTS[names[0]] = attrs.get("default")
    if attrs.get("metavar") == "PATH":
        _PATH_OPTIONS[names[0]] = None


def add_options(parser: pytest.Parser) -> None:
    option = functools.partial(add_harness_option, parser)
    option("--device", choices=DEVICE_CHOICES, default="auto",
           help="device for tensors and models (auto: cuda when present)")
    option("--graph-backend", choices=BACKEND_CHOICES, default="auto",
           help="graph backend (auto: cuda on a CUDA device, else emulated; cuda needs a CUDA device)")
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
    option("--hazard-amplifiers", choices=("on", "off"), default="on",
           help="on CUDA, fill the memory nobody owns with NaN bytes before each checked call and after each "
                "capture, and start every side stream's work late, so that a read of released or unwritten memory, "
                "or of a stream nobody waited for, fails instead of passing by chance; on any device, the pad-row "
                "tests also make every fresh allocation NaN (harness.hazards; default on)")
    option("--golden-dir", metavar="PATH", default=None,
           help="keep the suites' goldens in PATH (an engine's own, mirroring the suites' layout) instead of the "
                f"harness's golden/ folder: read there, written there by --snapshot-update (ini: {GOLDEN_DIR_INI}; "
                "relative to the current folder)")


def add_ini_settings(parser: pytest.Parser) -> None:
    """The harness's ini settings (they activate nothing: an engine's unrelated runs may read the same ini)."""
    parser.addini(GOLDEN_DIR_INI, default="",
                  help="the folder of an engine's own goldens (as --golden-dir, which wins), relative to this file's "
                       "folder")


def given_golden_dir(config: pytest.Config) -> Path | None:
    """The folder of this run's own goldens, absolute: ``--golden-dir`` (relative to the invocation folder), else the
    ini's ``harness_golden_dir`` (relative to the ini file's folder), else None (the harness's ``golden/``)."""
    given = config.getoption("--golden-dir", None)
    if given:
        return (Path(config.invocation_params.dir) / given).resolve()
    setting = str(config.getini(GOLDEN_DIR_INI) or "").strip()
    if not setting:
        return None
    base = config.inipath.parent if config.inipath is not None else config.rootpath
    return (base / setting).resolve()


def given_options(config: pytest.Config) -> list[str]:
    """The harness options this run was given: a value other than the default, or the flag itself (an
    explicit ``--device auto`` too) on the command line, in ``PYTEST_ADDOPTS`` or in ``addopts``."""
    words = [str(word) for word in config.invocation_params.args]
    words += [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *config.getini("addopts")]
    return [flag for flag, default in _OPTION_DEFAULTS.items()
            if config.getoption(flag, default) != default
            or any(word == flag or word.startswith(flag + "=") for word in words)]


def path_options() -> list[str]:
    """The harness's options whose value is a path (``--golden-dir``, ``--harness-report``, ...)."""
    return list(_PATH_OPTIONS)


def refuse_separate_path_values(config: pytest.Config) -> None:
    """Refuse a path option of the harness written as two words (``--harness-report PATH``) on the command line or in
    ``PYTEST_ADDOPTS``, in one line naming the option and the joined form. pytest looks for its rootdir and ini file
    before it knows a plugin's options, so there the separate value counts as a test path: an existing file or
    folder moves the rootdir (another ini, or none, and node ids relative to elsewhere), under ``--pyargs`` too."""
    for where, words in (("", [str(word) for word in config.invocation_params.args]),
                         (" in PYTEST_ADDOPTS", shlex.split(os.environ.get("PYTEST_ADDOPTS", "")))):
        for word, value in zip(words, words[1:]):
            if word in _PATH_OPTIONS:
                raise pytest.UsageError(
                    f"{word} {value}{where}: join the path to its option, {word}={shlex.quote(value)}: pytest reads "
                    "a separate value as a test path while it looks for its rootdir and ini file, before the "
                    "harness's options are known, so an existing path there moves the rootdir")
