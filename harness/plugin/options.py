"""The harness's pytest options; giving any of them activates the harness in a run.

Declaring them imports neither torch nor hypothesis (the choices come from :mod:`harness.devices`)."""

from __future__ import annotations

import functools
import os
import shlex
from typing import Any

import pytest

from harness import impls
from harness.devices import BACKEND_CHOICES, DEVICE_CHOICES, EXPERTS_IMPLEMENTATIONS, EXPERTS_VARIABLE

__all__ = ["add_harness_option", "add_options", "given_options"]

# Every option of the harness (flag -> default), filled by add_harness_option: one given activates the harness.
_OPTION_DEFAULTS: dict[str, Any] = {}


def add_harness_option(parser: pytest.Parser, *names: str, **attrs: Any) -> None:
    """Add an option to the harness's group; giving it on the command line (or in ``addopts``, or
    ``PYTEST_ADDOPTS``) activates the harness."""
    parser.getgroup("harness", "LLM graph-optimisation harness").addoption(*names, **attrs)
    _OPTION_DEFAULTS[names[0]] = attrs.get("default")


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


def given_options(config: pytest.Config) -> list[str]:
    """The harness options this run was given: a value other than the default, or the flag itself (an
    explicit ``--device auto`` too) on the command line, in ``PYTEST_ADDOPTS`` or in ``addopts``."""
    words = [str(word) for word in config.invocation_params.args]
    words += [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *config.getini("addopts")]
    return [flag for flag, default in _OPTION_DEFAULTS.items()
            if config.getoption(flag, default) != default
            or any(word == flag or word.startswith(flag + "=") for word in words)]
