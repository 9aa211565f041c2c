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
        ("graphs", "no-such-package:thing", ImplementationError, "not of the form 'package.module:attribute'"),
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


# --- start-up validation of user modules: one line naming the problem ---------------------------

_USER_MODULE = '''
import torch
from harness.graphs import GraphCapturer
from harness.runner import LayerStackRunner


class NotACapturer:
    pass


class CapturerWithoutPool:
    def __init__(self, backend):
        self.backend = backend

    def capture(self, fn, *, pool=None, warmup_runs=1):
        return fn()


class CaptureReturnsNoGraph(GraphCapturer):
    def capture(self, fn, *, pool=None, warmup_runs=1):
        return fn()


class ReplayRaises(GraphCapturer):
    def capture(self, fn, *, pool=None, warmup_runs=1):
        graph = super().capture(fn, pool=pool, warmup_runs=warmup_runs)
        graph.replay = lambda: 1 / 0
        return graph


def capturer_factory(backend):
    return GraphCapturer(backend)


def runner_without_buckets(model, *, graphs, strict_discovery=False):
    return LayerStackRunner(model, buckets=(4,), graphs=graphs)


def runner_returning_none(model, *, buckets, graphs, strict_discovery=False):
    return None


class RunnerWhoseRunRaises(LayerStackRunner):
    def run(self, batch):
        raise RuntimeError("no kernel for this bucket")


def runner_factory(model, *, buckets, graphs, strict_discovery=False):
    return LayerStackRunner(model, buckets=buckets, graphs=graphs, strict_discovery=strict_discovery)
'''


@pytest.fixture(scope="module")
def user_modules(tmp_path_factory):
    """A folder on sys.path with user modules: good and bad candidates, one with a syntax error,
    one raising on import, one importing a package that is not installed."""
    import sys

    folder = tmp_path_factory.mktemp("user_modules")
    (folder / "issue12_candidates.py").write_text(_USER_MODULE)
    (folder / "issue12_syntax_error.py").write_text("def broken(:\n    pass\n")
    (folder / "issue12_raises.py").write_text("x = 1\nraise RuntimeError('cannot reach the engine')\n")
    (folder / "issue12_missing_dependency.py").write_text("import issue12_not_installed_anywhere\n")
    (folder / "issue12_attribute_error.py").write_text("import os\nos.no_such_function()\n")
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


@pytest.mark.parametrize(
    ("component", "spec", "pattern"),
    [
        ("graphs", "issue12_syntax_error:X", r"importing 'issue12_syntax_error' failed: SyntaxError: .* \(at "
                                             r"issue12_syntax_error.py:1\)"),
        ("graphs", "issue12_raises:X", r"importing 'issue12_raises' failed: RuntimeError: cannot reach the engine "
                                       r"\(at issue12_raises.py:2\)"),
        ("graphs", "issue12_missing_dependency:X", r"it imports 'issue12_not_installed_anywhere', which is not "
                                                   r"installed"),
        # an AttributeError of the module's own code is its failing import, not a missing attribute
        ("graphs", "issue12_attribute_error:X",
         r"importing 'issue12_attribute_error' failed: AttributeError: .*no_such_function"),
        ("graphs", "issue12_candidates:NotACapturer", r"NotACapturer\(\) cannot be called as factory\(backend\)"),
        ("graphs", "issue12_candidates:CapturerWithoutPool", r"is a CapturerWithoutPool with no new_pool"),
        ("graphs", "issue12_candidates:CaptureReturnsNoGraph", r"the graph capture\(\) returned is a Tensor with no "
                                                               r"output, "),
        ("graphs", "issue12_candidates:ReplayRaises", r"graph.replay\(\) raised ZeroDivisionError: division by zero "
                                                      r"\(at issue12_candidates.py:\d+\)"),
        ("runner", "issue12_candidates:runner_without_buckets", r"cannot be called as factory\(model, \*, buckets, "
                                                                r"graphs.*'buckets'"),
        ("runner", "issue12_candidates:runner_returning_none", r"returned is a NoneType with no discovery, buckets, "
                                                               r"stats, bucket_for"),
        ("runner", "issue12_candidates:RunnerWhoseRunRaises", r"runner.run\(one request of 3 tokens\) raised "
                                                              r"RuntimeError: no kernel for this bucket \(at "
                                                              r"issue12_candidates.py:\d+\)"),
    ],
)
def test_bad_user_module_is_one_line(user_modules, component, spec, pattern):
    with pytest.raises(ImplementationError, match=pattern) as caught:
        impls.load(component, spec)
    message = str(caught.value)
    assert message.startswith(f"--impl {component}={spec}: ") and "\n" not in message


@pytest.mark.parametrize(("component", "spec"), [("graphs", "issue12_candidates:capturer_factory"),
                                                 ("runner", "issue12_candidates:runner_factory")])
def test_good_user_module_passes_the_smoke_call(user_modules, component, spec):
    assert impls.load(component, spec).kind == "external"


@pytest.mark.parametrize("component", impls.components())
def test_the_reference_named_by_path_passes_the_smoke_call(component):
    from harness.components import get_component

    assert impls.load(component, get_component(component).reference).kind == "external"


@pytest.mark.parametrize("component", impls.components())
def test_every_registered_implementation_loads(component):
    """Registered mutants skip the smoke call: one too broken to build is for its suite to kill."""
    for name, impl in impls.implementations(component).items():
        assert impls.load(component, name).obj is impl.obj


class _GcOffCapturer(GraphCapturer):
    """Switches the garbage collector off in every capture and never back on: the suites must see that."""

    def capture(self, *args, **kwargs):
        import gc

        gc.disable()
        return super().capture(*args, **kwargs)


@pytest.mark.parametrize(("component", "candidate"), [
    ("graphs", _GcOffCapturer),
])
def test_the_smoke_call_leaves_no_process_state_behind(component, candidate):
    """What the start-up smoke call changes is put back, so the first checked call in the suites starts from the
    caller's state and the oracle sees the change there (a smoke call that left gc off hid the leak)."""
    import gc

    from harness.graphs.candidate import validate_capturer_factory

    assert gc.isenabled()
    try:
        validate_capturer_factory(candidate, f"{component}=test:{candidate.__name__}")
        assert gc.isenabled()
    finally:
        gc.enable()
