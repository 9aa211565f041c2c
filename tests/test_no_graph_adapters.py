"""The ``@no_graph`` packages under the harness (``--impl graphs=bcg``, ``--impl graphs=pcg``), on the CPU.

What runs here: the adapters' one-line refusals (the package missing, failing to import, a backend other than CUDA),
their names in ``python -m harness list``, the engine version the reports name, the clauses they document away
(quoted verbatim from the package), what counts as a CUDA tensor in a break's result, and the bridges driven
against each package's released module with a stand-in CUDA graph (which records and replays nothing: the order of
segments and breaks, the counts, the names, what a break reads at replay and the errors are what it shows). The
released wheels are found at ``HARNESS_BCG_WHEEL`` / ``HARNESS_PCG_WHEEL`` or in ``/tmp/bcg-wheel`` /
``/tmp/pcg-wheel``; without them those tests skip, saying so. The suites themselves run against the packages on a
GPU (``.ci/gpu/engine-conformance``, ``ENGINES="bcg pcg"``).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
from engine_releases import STAND_IN_CUDA_PATCHES, needs_release_wheel, release_wheel

from harness import cli, conformance, impls
from harness.adapters import bcg, pcg
from harness.adapters.no_graph import holds_cuda_tensor
from harness.conformance.clauses import clauses_of
from harness.errors import ImplementationError, UsageError
from harness.graphs import get_backend

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = {"bcg": bcg, "pcg": pcg}
CAPTURERS = {"bcg": bcg.BCGCapturer, "pcg": pcg.PCGCapturer}
# The package's own "is a capture running" function, per adapter.
IS_IN = {"bcg": "is_in_breakable_graph", "pcg": "is_in_piecewise_graph"}
WHEELS = {spec: release_wheel(spec, adapter.PACKAGE.version, distribution=adapter.PACKAGE.distribution)
          for spec, adapter in ADAPTERS.items()}


def _with_wheel(spec: str) -> pytest.param:
    package = ADAPTERS[spec].PACKAGE
    return pytest.param(spec, id=spec, marks=needs_release_wheel(
        WHEELS[spec], engine=spec, name=package.distribution, version=package.version,
        distribution=package.distribution))


BOTH = [pytest.param(spec, id=spec) for spec in ADAPTERS]
BOTH_WHEELS = [_with_wheel(spec) for spec in ADAPTERS]


@pytest.fixture
def unpacked(tmp_path) -> Path:
    """A folder holding the wheel's files: a pure-Python wheel unpacked is the package installed (its dist-info
    included, so importlib.metadata finds its version)."""
    return tmp_path / "site"


def _unpack(spec: str, folder: Path) -> Path:
    wheel = WHEELS[spec]
    assert wheel is not None
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(folder)
    return folder


@pytest.fixture
def forget_packages():
    """Drop whatever a test imported of a package (real or made up), so other tests see none."""
    yield
    for adapter in ADAPTERS.values():
        sys.modules.pop(adapter.PACKAGE.module, None)


def _python(code: str, *, path: Path) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with ``path`` first on PYTHONPATH (the imported package and the
    torch.cuda stand-ins must not leak into other tests)."""
    environment = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), str(ROOT), os.environ.get("PYTHONPATH", ""))
                                                if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=300)


# --- loading --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", BOTH)
def test_selecting_the_adapter_without_its_package_says_what_to_install(spec, monkeypatch):
    package = ADAPTERS[spec].PACKAGE
    monkeypatch.setitem(sys.modules, package.module, None)  # not importable, whether or not it is installed here
    with pytest.raises(ImplementationError) as raised:
        impls.load("graphs", spec, graph_backend="cuda")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"--impl graphs={spec} needs the package {package.distribution}, which is not "
                              f"importable here (")
    assert message.endswith(f"): pip install {package.distribution}==0.1.0 (for .ci/gpu/run on a machine without "
                            f"a package index, carry its wheel in .whl/)")


@pytest.mark.parametrize("spec", BOTH)
def test_a_package_that_fails_to_import_is_one_line(spec, tmp_path, monkeypatch, forget_packages):
    module = ADAPTERS[spec].PACKAGE.module
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / f"{module}.py").write_text("import a_dependency_that_is_not_here\n")
    with pytest.raises(ImplementationError) as raised:
        impls.load("graphs", spec, graph_backend="cuda")
    assert str(raised.value) == (f"--impl graphs={spec}: importing {module} failed: it imports "
                                 "'a_dependency_that_is_not_here', which is not installed")
    sys.modules.pop(module, None)
    (tmp_path / f"{module}.py").write_text("raise ValueError('no GPU build of torch')\n")
    with pytest.raises(ImplementationError) as raised:
        impls.load("graphs", spec, graph_backend="cuda")
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"--impl graphs={spec}: importing {module} failed: ")
    assert "ValueError" in message and "no GPU build of torch" in message


@pytest.mark.parametrize("spec", BOTH)
def test_the_adapter_refuses_a_backend_other_than_cuda(spec, tmp_path, monkeypatch, forget_packages):
    package = ADAPTERS[spec].PACKAGE
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / f"{package.module}.py").write_text("")  # importable: what the loader checks first
    with pytest.raises(UsageError) as raised:
        impls.load("graphs", spec, graph_backend="emulated")
    assert str(raised.value) == (
        f"--impl graphs={spec} captures real CUDA graphs with {package.sequence} of {package.distribution}, which "
        "the emulated backend cannot stand in for: run with --device cuda --graph-backend cuda on a GPU")
    with pytest.raises(UsageError, match="--graph-backend cuda"):
        CAPTURERS[spec](get_backend("emulated"))
    assert impls.load("graphs", spec, graph_backend="cuda").obj is CAPTURERS[spec]


def test_the_adapters_are_listed_by_their_short_names_without_importing_the_packages(capsys):
    cli.main(["list", "--component", "graphs"])
    listed = capsys.readouterr().out
    for spec in ADAPTERS:
        assert f"harness.adapters.{spec}:load_capturer  (--impl graphs={spec}, the engine's shipped code)" in listed
    assert impls.adapter_names("graphs") == ("bcg", "pcg", "sglang", "trtllm", "vllm")
    assert not {adapter.PACKAGE.module for adapter in ADAPTERS.values()} & set(sys.modules)


@pytest.mark.parametrize("spec", BOTH)
def test_the_version_is_the_modules_own_where_no_distribution_is_installed(spec, tmp_path, monkeypatch,
                                                                        forget_packages):
    package = ADAPTERS[spec].PACKAGE
    try:
        installed = importlib.metadata.version(package.distribution)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed is not None:
        pytest.skip(f"{package.distribution} {installed} is installed here: its metadata names the version")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / f"{package.module}.py").write_text("__version__ = '0.0.7'\n")
    assert ADAPTERS[spec].engine_version() == "0.0.7"
    assert conformance._engine("graphs", spec) == f"{spec} 0.0.7"


@pytest.mark.parametrize("spec", BOTH_WHEELS)
def test_the_version_of_the_released_wheel_is_its_metadatas(spec, unpacked):
    result = _python(f"from harness.adapters.{spec} import engine_version; print(engine_version())",
                     path=_unpack(spec, unpacked))
    assert result.stdout.strip() == "0.1.0", result.stdout + result.stderr


# --- the contract each package documents ----------------------------------------------------------------------


@pytest.mark.parametrize("spec", BOTH)
def test_the_documented_away_clauses_are_graphs_clauses_and_reach_the_report(spec):
    declared = ADAPTERS[spec].DOCUMENTED_AWAY
    assert set(declared) == {"graphs"}
    ids = {clause.id for clause in clauses_of("graphs")}
    clauses = [entry.clause for entry in declared["graphs"]]
    assert clauses == ["write-back", "changes-raise", "immutable-values-refused"] and set(clauses) <= ids
    assert [entry.clause for entry in conformance.documented_away("graphs", spec)] == clauses
    # nesting has no sentence in either package: not-reentrant and nested-breaks-inline are judged as they stand
    assert not {"not-reentrant", "nested-breaks-inline", "pools", "live-breaks"} & set(clauses)


@pytest.mark.parametrize("spec", BOTH_WHEELS)
def test_the_documented_away_quotes_are_the_packages_own_sentences(spec, unpacked):
    """Each declaration quotes the package's module verbatim (docstrings wrap: compared with the spacing folded)."""
    package = ADAPTERS[spec].PACKAGE
    source = " ".join((_unpack(spec, unpacked) / f"{package.module}.py").read_text().split())
    for entry in ADAPTERS[spec].DOCUMENTED_AWAY["graphs"]:
        assert " ".join(entry.quote.split()) in source, f"{entry.clause}: not in {package.module}.py: {entry.quote}"
        assert entry.where == f"{package.module}.py, no_graph" and "def no_graph(" in source


class _ReportsCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA, as the packages' check and the adapter's read it."""

    is_cuda = property(lambda self: True)  # type: ignore[assignment]


@dataclasses.dataclass
class _Batch:
    hidden: object
    lengths: list


class _Slotted:
    __slots__ = ("kv",)

    def __init__(self, kv: object) -> None:
        self.kv = kv


def test_a_cuda_tensor_is_found_wherever_a_break_result_holds_it():
    cuda = torch.zeros(2).as_subclass(_ReportsCuda)
    host = torch.zeros(2)
    assert holds_cuda_tensor(cuda)
    assert holds_cuda_tensor({"a": [1, (host, cuda)]}) and holds_cuda_tensor(_Batch(cuda, [1]))
    assert holds_cuda_tensor(_Slotted(cuda)) and holds_cuda_tensor([_Batch(host, [_Slotted(cuda)])])
    cycle: list = [host]
    cycle.append(cycle)
    assert not holds_cuda_tensor(cycle)
    cycle.append({"late": cuda})
    assert holds_cuda_tensor(cycle)
    for within in (None, 3, "text", [1, 2.5], host, {"a": host}, _Batch(host, [1]), _Slotted(None), torch.float32):
        assert not holds_cuda_tensor(within), within


# --- the bridges, against each package's released module ---------------------------------------------------------

# torch.cuda's stream, device, pool and graph calls replaced by stand-ins that log (a graph whose capture has ended
# refuses to end again, as CUDA does), torch.cuda.graph and the package as released, the adapter as shipped.
_STAND_IN_CUDA = """
    import contextlib, dataclasses, gc, itertools
    import torch
    log = []
    class Stream:
        def __init__(self, device=None): pass
        def wait_stream(self, other): log.append("wait")
    class Graph:
        ids = itertools.count()
        def __init__(self): self.id, self.capturing = next(Graph.ids), False
        def capture_begin(self, pool=None, **options):
            self.capturing = True
            log.append(f"begin {self.id} pool {pool[1]} {options.get('capture_error_mode')}")
        def capture_end(self):
            if not self.capturing:
                raise RuntimeError("CUDA error: operation not permitted when stream is not capturing")
            self.capturing = False
            log.append(f"end {self.id}")
        def replay(self): log.append(f"replay {self.id}")
        def reset(self): log.append(f"reset {self.id}")
""" + STAND_IN_CUDA_PATCHES + """
    torch._C._host_emptyCache = lambda: None  # torch.cuda.graph empties the host cache too; a CPU build lacks it
    from harness.adapters.SPEC import CAPTURER as Capturer
    from harness.conformance.clauses import running_test_notes
    from harness.graphs import eager_on_graph, is_capturing
    from MODULE import IS_IN as is_in_package_capture
"""

_DRIVE = """
    seen = []  # is_capturing() (the harness's) and the package's own where each runs
    @dataclasses.dataclass
    class Meta:
        step: int
    @eager_on_graph
    def attention(plan, meta, h):
        log.append(f"attention plan {plan['step']} meta {meta.step} h {h.item():g}")
        seen.append(("attention", is_capturing(), is_in_package_capture()))
    @eager_on_graph
    def sample(lengths):
        log.append(f"sample {lengths}")
        return [len(lengths)]  # a Python value in a list: allowed by the package
    plan, meta, h, lengths = {"step": 0}, Meta(0), torch.zeros(()), [1, 2]
    def forward():
        log.append("forward")
        seen.append(("forward", is_capturing(), is_in_package_capture()))
        attention(plan, meta, h)
        return sample(lengths)
    capturer = Capturer(CudaBackend())
    graph = capturer.capture(forward, pool=None, warmup_runs=2)
    print("capture:", log); log.clear()
    print("seen:", seen); seen.clear()
    print("graph:", graph.segment_count, graph.break_count, graph.break_names)
    print("notes:", running_test_notes(clear=True))
    plan["step"] = meta.step = 5
    h.fill_(5)
    lengths.append(3)
    out = graph.replay()
    print("replay:", out is graph.output, out, log); log.clear()
    capturer.capture(lambda: None, pool=capturer.new_pool(), warmup_runs=0)
    print("pool:", log); log.clear()

    class ReportsCuda(torch.Tensor):
        is_cuda = property(lambda self: True)
    @eager_on_graph
    def fresh(h):
        log.append("fresh")
        return {"h": (h * 2).as_subclass(ReportsCuda)}
    @eager_on_graph
    def inner():
        log.append("inner")
    @eager_on_graph
    def outer():
        inner()
    @eager_on_graph
    def captures_again():
        capturer.capture(lambda: None, warmup_runs=0)
    @eager_on_graph
    def refuses(h):
        raise ValueError("refused")
    def handled(then):
        def program():
            try:
                refuses(h)
            except ValueError:
                log.append("handler")
            return then()
        return program
    cases = [("cuda result", lambda: fresh(h)), ("nested break", outer), ("nested capture", captures_again),
             ("handled then a break", handled(lambda: sample(lengths))), ("handled then the end", handled(lambda: h))]
    for name, body in cases:
        log.clear()
        try:
            captured = capturer.capture(body, warmup_runs=0)
            log.clear()
            captured.replay()
            print(f"{name}:", "captured", captured.segment_count, captured.break_count, "| replay:", log)
        except BaseException as error:
            print(f"{name}:", type(error).__name__, str(error).split(" is decorated")[0], "| log:", log,
                  "| notes:", running_test_notes(clear=True), "| capturing:", is_in_package_capture(),
                  "| collector on:", gc.isenabled())
"""


@pytest.mark.parametrize("spec", BOTH_WHEELS)
def test_the_adapter_drives_the_packages_capture_with_a_stand_in_cuda_graph(spec, unpacked):
    package = ADAPTERS[spec].PACKAGE
    script = (_STAND_IN_CUDA.replace("SPEC", spec).replace("CAPTURER", CAPTURERS[spec].__name__)
              .replace("MODULE", package.module).replace("IS_IN", IS_IN[spec]) + _DRIVE)
    result = _python(script, path=_unpack(spec, unpacked))
    lines = {line.partition(": ")[0]: line.partition(": ")[2] for line in result.stdout.splitlines()}
    expected = {"capture", "seen", "graph", "notes", "replay", "pool", "cuda result", "nested break", "nested capture",
                "handled then a break", "handled then the end"}
    assert set(lines) >= expected, result.stdout + result.stderr
    # Two warm-ups on the capture stream (breaks are plain calls), then the package's segments: torch.cuda.graph
    # synchronises the device as each begins; one ended before each break, which runs eagerly, and one begun after
    # it, all in the capture's pool, in global mode.
    segment = ["sync", "begin {} pool 0 global"]
    assert eval(lines["capture"]) == (
        ["wait"] + ["forward", "attention plan 0 meta 0 h 0", "sample [1, 2]"] * 2
        + [segment[0], segment[1].format(0), "forward", "end 0", "attention plan 0 meta 0 h 0",
           segment[0], segment[1].format(1), "end 1", "sample [1, 2]", segment[0], segment[1].format(2), "end 2",
           "wait"])
    # the harness's is_capturing(): in the forward while the capture runs, never in a break body; the package's own:
    # throughout the capture
    assert eval(lines["seen"]) == [("forward", False, False), ("attention", False, False)] * 2 + [
        ("forward", True, True), ("attention", False, True)]
    assert lines["graph"] == "3 2 ['attention', 'sample']"  # the package's own counts, the names of its breaks
    assert lines["notes"] == "{}"  # no break returned a CUDA tensor: every test so far is within the contract
    # The package's replay: segments and eager steps in capture order. A dataclass argument is the caller's own
    # object (step 5), a tensor off CUDA too (h 5; on CUDA an alias of its memory that owns nothing); a dict or list
    # argument is the copy its pytree map made at capture, so the break reads the capture-time members (plan 0,
    # lengths [1, 2]): what the suites' live-breaks tests check on the GPU. What the break returned, [2], is handed
    # back at capture and never refreshed (eager gives [3]): the write-back the package's docstring narrows.
    assert lines["replay"] == ("True [2] ['replay 0', 'attention plan 0 meta 5 h 5', 'replay 1', 'sample [1, 2]', "
                               "'replay 2']")
    assert eval(lines["pool"]) == ["wait", "sync", "begin 3 pool 1 global", "end 3", "wait"]  # the pool given
    # A break returning a (stood-in) CUDA tensor: the adapter tells the report the test is outside the contract,
    # and the package refuses it at capture, after the break ran, leaving no capture running and the collector on.
    tail = "| capturing: False | collector on: True"
    assert lines["cuda result"] == (f"RuntimeError `fresh` | log: ['wait', 'sync', 'begin 4 pool 2 global', 'end 4', "
                                    f"'fresh', 'wait'] | notes: {{'outside_contract': ['write-back']}} {tail}")
    # A break inside a break body reaches the package's no_graph, which ends the ended segment again: a bare
    # assertion, before the inner body runs (nested-breaks-inline, judged as it stands)
    assert lines["nested break"].startswith("AssertionError  | log: ") and "inner" not in lines["nested break"]
    assert lines["nested break"].endswith(f"| notes: {{}} {tail}")
    # A capture begun in a break body is refused with the package's RuntimeError, not CaptureError (not-reentrant,
    # judged as it stands: no sentence of the package narrows it)
    nested = f"nested {package.context} captures are not supported"
    assert lines["nested capture"].startswith(f"RuntimeError {nested} | log: ")
    assert lines["nested capture"].endswith(tail)
    # A break that raises at capture, handled by the program: the package has ended the segment and begins none, so
    # the handler runs uncaptured; a later break ends the ended segment again (a bare assertion), and without one
    # the capture succeeds with nothing of what followed the refused break (handled-break-errors)
    assert lines["handled then a break"].startswith("AssertionError  | log: ")
    assert "'handler'" in lines["handled then a break"] and "sample" not in lines["handled then a break"]
    assert lines["handled then the end"] == "captured 1 0 | replay: ['replay 8']"
