"""The implementation registry: resolution of --impl specs and the errors for bad ones."""

from __future__ import annotations

import pytest

from harness import impls
from harness.errors import ImplementationError, UsageError
from harness.graphs import GraphCapturer


def test_reference_and_mutants_are_registered():
    assert impls.load("graphs", "reference").obj is GraphCapturer
    names = {impl.name for impl in impls.mutants("graphs")}
    assert len(names) >= 9 and all(name.startswith("mutant:") for name in names)
    assert all(impl.bug for impl in impls.mutants("graphs")), "every mutant must say which bug it reproduces"


def test_module_attribute_spec_loads_external_object():
    impl = impls.load("graphs", "harness.graphs:GraphCapturer")
    assert impl.obj is GraphCapturer and impl.kind == "external"


@pytest.mark.parametrize(
    ("component", "spec", "error", "pattern"),
    [
        ("graphs", "no_such_package.module:thing", ImplementationError, "cannot be imported"),
        ("graphs", "harness.graphs:NoSuchThing", ImplementationError, "has no attribute 'NoSuchThing'"),
        ("graphs", "harness.graphs:BACKEND_NAMES", ImplementationError, "expected a class or factory"),
        ("graphs", "mutant:does-not-exist", UsageError, "no registered implementation"),
        ("graphs", "plainname", UsageError, "package.module:attribute"),
        ("kernels", "reference", UsageError, "unknown component 'kernels'"),
    ],
)
def test_bad_specs_name_the_problem(component, spec, error, pattern):
    with pytest.raises(error, match=pattern):
        impls.load(component, spec)


@pytest.mark.parametrize("option", ["gather", "=x", "gather=", "  =  "])
def test_malformed_option_is_a_usage_error(option):
    with pytest.raises(UsageError, match="expected COMPONENT=SPEC"):
        impls.parse_impl_option(option)
