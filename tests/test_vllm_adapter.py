"""vLLM's breakable capture under the harness (``--impl graphs=vllm``), on the CPU.

What runs here: ``.ci/gpu/extract-vllm`` on the release wheel (its files unchanged, its stand-ins listed, the
capture module importable without a GPU), the adapter's one-line refusals, the quotes it documents clauses away
with, and its bridges driven against vLLM's real ``BreakableCUDAGraphCapture`` with a stand-in CUDA graph
(which records and replays nothing: the order of segments and breaks, the counts, the names and the errors
are what it shows). The wheel is found at ``HARNESS_VLLM_WHEEL`` or in ``/tmp/vllm-wheel``; without it those
tests skip, saying so. The suites themselves run against vLLM on a GPU (``.ci/gpu/engine-conformance``).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import types
import zipfile
from pathlib import Path

import pytest
import torch
from engine_releases import STAND_IN_CUDA_PATCHES, extraction_script, needs_release_wheel, release_wheel

from harness import conformance, impls
from harness.adapters.vllm import DOCUMENTED_AWAY, VLLM_VERSION, VLLMCapturer
from harness.conformance.clauses import clauses_of
from harness.errors import ImplementationError, UsageError
from harness.graphs import get_backend

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "gpu" / "extract-vllm"
BREAKABLE = "vllm/compilation/breakable_cudagraph.py"


WHEEL = release_wheel("vllm", VLLM_VERSION)
needs_wheel = needs_release_wheel(WHEEL, engine="vllm", name="vLLM", version=VLLM_VERSION)
needs_no_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                                   reason="vLLM is importable in this environment")


def _script() -> types.ModuleType:
    return extraction_script(SCRIPT)


@pytest.fixture(scope="module")
def extracted(tmp_path_factory) -> Path:
    if WHEEL is None:
        pytest.skip("no vLLM wheel (see needs_wheel)")
    folder = tmp_path_factory.mktemp("extract") / ".vllm"
    completed = subprocess.run([sys.executable, str(SCRIPT), str(WHEEL), str(folder)], capture_output=True, text=True,
                               timeout=300)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert completed.stdout.startswith(f"{folder}: ") and "stand-ins" in completed.stdout
    return folder


def _python(code: str, *, path: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with the folder first on PYTHONPATH (an imported vllm, and the
    torch.cuda stand-ins of the plumbing test, must not leak into other tests)."""
    environment = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), str(ROOT), os.environ.get("PYTHONPATH", ""))
                                                if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def forget_vllm():
    """Drop whatever an adapter imported of the extracted vllm package, so other tests see none."""
    yield
    for name in [name for name in sys.modules if name == "vllm" or name.startswith("vllm.")]:
        del sys.modules[name]


# --- the extraction --------------------------------------------------------------------------------


@needs_wheel
def test_extracted_files_are_the_wheels_own_bytes(extracted):
    script = _script()
    with zipfile.ZipFile(WHEEL) as archive:
        for name in script.EXTRACTED:
            assert (extracted / name).read_bytes() == archive.read(name), f"{name} differs from the wheel's"
    assert BREAKABLE in script.EXTRACTED


@needs_wheel
def test_every_other_file_is_a_stand_in_listed_with_the_wheels_digest(extracted):
    script = _script()
    files = {path.relative_to(extracted).as_posix() for path in extracted.rglob("*") if path.is_file()}
    assert files == set(script.EXTRACTED) | set(script.STANDINS) | {"STANDINS.md"}
    assert not set(script.EXTRACTED) & set(script.STANDINS)
    listing = (extracted / "STANDINS.md").read_text()
    assert hashlib.sha256(WHEEL.read_bytes()).hexdigest() in listing and WHEEL.name in listing
    stand_ins = listing.split("Stand-ins", 1)[1]
    for name in script.STANDINS:
        assert f"- `{name}`" in stand_ins, f"STANDINS.md does not list the stand-in {name}"
        docstring = (extracted / name).read_text()
        # each says what it stands in for (and, past the first line, how it differs)
        assert docstring.startswith('"""Stand-in (harness .ci/gpu/extract-vllm) for '), name
    for name in script.EXTRACTED:
        assert f"- `{name}`" in listing.split("Stand-ins", 1)[0]
    # harness: the weak_ref_tensor stand-in reports itself to the conformance report where the harness is installed
    assert "Installed modules these files import: `harness`, `regex`, `torch`." in listing


@needs_wheel
def test_the_extracted_capture_imports_on_a_cpu_only_machine(extracted):
    result = _python("""
        import sys, torch
        import vllm
        from vllm.compilation.breakable_cudagraph import (BreakableCUDAGraphCapture, BreakableCUDAGraphWrapper,
                                                          eager_break_during_capture)
        from vllm.utils.torch_utils import weak_ref_tensor
        print("version", vllm.__version__)
        print("from the folder", all(m.__file__.startswith(FOLDER) for n, m in sys.modules.items()
                                     if n.startswith("vllm") and getattr(m, "__file__", None)))
        print("no capture", BreakableCUDAGraphCapture.current())
        # outside a capture vLLM's break is a plain call
        print("plain", eager_break_during_capture(lambda x, *, y: x + y)(torch.ones(2), y=2.0).tolist())
        # the stand-in of vLLM's compiled op: as the op, a tensor off CUDA is refused, empty tensors and
        # non-tensors are handed back as they are
        try:
            weak_ref_tensor(torch.ones(2))
        except RuntimeError as error:
            print("refused", error)
        empty = torch.empty(0)
        print("passed through", weak_ref_tensor(empty) is empty, weak_ref_tensor(3))
    """.replace("FOLDER", repr(str(extracted))), path=extracted)
    out = result.stdout
    assert f"version {VLLM_VERSION}" in out and "from the folder True" in out, out + result.stderr
    assert "no capture None" in out and "plain [3.0, 3.0]" in out
    assert "refused Tensor must be on CUDA device" in out and "passed through True 3" in out


@needs_wheel
def test_the_weak_ref_stand_in_holds_memory_as_weakly_as_vllms_op(extracted):
    """vLLM's op is CUDA only; the stand-in builds its alias the same way on any device, so its helper shows here
    what a break argument becomes: the same memory, sizes, strides and dtype, and nothing that keeps it alive."""
    result = _python("""
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef
        from vllm.utils.torch_utils import _unowned_alias
        for dtype in (torch.float32, torch.bfloat16, torch.complex128, torch.bool):
            base = torch.zeros(5, 7, dtype=dtype)
            view = base[1:, 2:5].t()  # offset and transposed
            alias = _unowned_alias(view)
            same = (alias.shape, alias.stride(), alias.dtype, alias.data_ptr()) == (
                view.shape, view.stride(), view.dtype, view.data_ptr())
            base[1, 2] = 1
            seen = bool(alias[0, 0] == 1)  # a write through the owner is read through the alias
            owner = StorageWeakRef(base.untyped_storage())
            del base, view
            print(dtype, same, seen, alias.storage_offset(), "released:", owner.expired())
    """, path=extracted)
    lines = result.stdout.splitlines()
    assert len(lines) == 4, result.stdout + result.stderr
    assert all(line.endswith(" True True 0 released: True") for line in lines), result.stdout


def test_an_import_the_folder_does_not_provide_stops_the_extraction():
    """A release whose capture module imports something new fails at extraction, naming the import."""
    script = _script()
    files = {"vllm/__init__.py": "", "vllm/compilation/__init__.py": "",
             "vllm/compilation/breakable_cudagraph.py": "import torch\nfrom vllm.config import VllmConfig, NewMode\n"
                                                        "from vllm.kernels import op\n"
                                                        "if TYPE_CHECKING:\n    from vllm.sequence import X\n"
                                                        "def later():\n    from vllm.engine import E\n",
             "vllm/config/__init__.py": "class VllmConfig: ...\n"}
    assert script.unprovided_imports(files) == [
        "vllm/compilation/breakable_cudagraph.py:2: imports NewMode from vllm.config, which does not define it",
        "vllm/compilation/breakable_cudagraph.py:3: imports vllm.kernels, which the folder does not provide"]
    assert script.third_party_imports(files) == ["torch"]


def test_the_extraction_refuses_a_wheel_without_the_capture(tmp_path):
    wheel = tmp_path / "vllm-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
    completed = subprocess.run([sys.executable, str(SCRIPT), str(wheel), str(tmp_path / "out")], capture_output=True,
                               text=True, timeout=60)
    assert completed.returncode == 1 and not (tmp_path / "out").exists()
    assert "lacks vllm/version.py" in completed.stderr and f"targets vllm {VLLM_VERSION}" in completed.stderr


# --- the adapter -----------------------------------------------------------------------------------


@needs_no_vllm
def test_selecting_vllm_without_its_modules_names_the_extract_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VLLM_MODULES", raising=False)
    with pytest.raises(ImplementationError) as raised:
        impls.load("graphs", "vllm", graph_backend="cuda")
    message = str(raised.value)
    assert "\n" not in message and message.startswith("--impl graphs=vllm needs vLLM's modules")
    assert "there is no folder .vllm: .ci/gpu/extract-vllm WHEEL .vllm makes it" in message
    assert f"pip download vllm=={VLLM_VERSION} --no-deps" in message
    # a folder that exists but is not on the path is named as such
    (tmp_path / ".vllm" / "vllm").mkdir(parents=True)
    with pytest.raises(ImplementationError, match=r"the folder \.vllm holds them but is not on PYTHONPATH"):
        impls.load("graphs", "vllm", graph_backend="emulated")


@needs_wheel
def test_the_vllm_adapter_refuses_a_backend_other_than_cuda(extracted, monkeypatch, forget_vllm):
    monkeypatch.syspath_prepend(str(extracted))
    with pytest.raises(UsageError) as raised:
        impls.load("graphs", "vllm", graph_backend="emulated")
    assert str(raised.value) == (
        "--impl graphs=vllm captures real CUDA graphs with vLLM's BreakableCUDAGraphCapture, which the emulated "
        "backend cannot stand in for: run with --device cuda --graph-backend cuda on a GPU")
    with pytest.raises(UsageError, match="--graph-backend cuda"):
        VLLMCapturer(get_backend("emulated"))
    assert impls.load("graphs", "vllm", graph_backend="cuda").obj is VLLMCapturer


def test_the_documented_away_clauses_are_graphs_clauses_and_reach_the_report():
    assert set(DOCUMENTED_AWAY) == {"graphs"}
    ids = {clause.id for clause in clauses_of("graphs")}
    declared = [entry.clause for entry in DOCUMENTED_AWAY["graphs"]]
    assert set(declared) <= ids and len(declared) == len(set(declared))
    assert [entry.clause for entry in conformance.documented_away("graphs", "vllm")] == declared
    assert conformance.documented_away("graphs", "sglang") == () == conformance.documented_away("graphs", "reference")


@needs_wheel
def test_the_documented_away_quotes_are_vllms_own_sentences(extracted):
    """Each declaration quotes vLLM's capture module verbatim (docstrings wrap: compared with the spacing folded)."""
    source = " ".join((extracted / BREAKABLE).read_text().split())
    for entry in DOCUMENTED_AWAY["graphs"]:
        assert " ".join(entry.quote.split()) in source, f"{entry.clause}: not in {BREAKABLE}: {entry.quote}"
        assert entry.where.startswith(BREAKABLE)
        assert entry.where.rpartition(", ")[2].split(".")[0] in source  # the object named there exists
    nested = next(entry for entry in DOCUMENTED_AWAY["graphs"] if entry.clause == "not-reentrant")
    assert re.search(r'RuntimeError\("Nested BreakableCUDAGraphCapture is not supported\."\)', source)
    assert "Nested BreakableCUDAGraphCapture is not supported." in nested.note


# What the plumbing test runs: torch.cuda's stream, device, pool and graph calls replaced by stand-ins that log,
# vLLM's BreakableCUDAGraphCapture and eager_break_during_capture as extracted, the adapter as shipped.
_STAND_IN_CUDA = """
    import contextlib, gc, itertools
    import torch
    log = []
    class Stream:
        def __init__(self, device=None): pass
        def wait_stream(self, other): log.append("wait")
    class Graph:
        ids = itertools.count()
        def __init__(self): self.id = next(Graph.ids)
        def capture_begin(self, pool=None): log.append(f"begin {self.id} pool {pool[1]}")
        def capture_end(self): log.append(f"end {self.id}")
        def replay(self): log.append(f"replay {self.id}")
""" + STAND_IN_CUDA_PATCHES + """
    from harness.adapters.vllm import VLLMCapturer
    from harness.graphs import eager_on_graph
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture
"""


@needs_wheel
def test_the_adapter_drives_vllms_capture_with_a_stand_in_cuda_graph(extracted):
    result = _python(_STAND_IN_CUDA + """
    from harness.graphs import is_capturing
    seen = []  # what is_capturing() says in the forward and in each break body
    @eager_on_graph
    def inner(meta):
        log.append("inner")
        seen.append(("inner", is_capturing()))
    @eager_on_graph
    def attention(meta):
        log.append(f"attention {meta['step']}")
        seen.append(("attention", is_capturing()))
        inner(meta)  # a break inside a break body: inline, not a break of its own
        return meta
    @eager_on_graph
    def sample(meta):
        log.append(f"sample {meta['step']}")
    meta = {"step": 0}
    def forward():
        log.append("forward")
        seen.append(("forward", is_capturing()))
        attention(meta)
        sample(meta)
        return meta
    capturer = VLLMCapturer(CudaBackend())
    graph = capturer.capture(forward, pool=None, warmup_runs=2)
    print("capture:", log); log.clear()
    print("seen:", seen)
    print("graph:", graph.segment_count, graph.break_count, graph.break_names)
    meta["step"] = 5
    print("replay:", graph.replay() is meta is graph.output, log); log.clear()
    shared = capturer.new_pool()
    capturer.capture(lambda: None, pool=shared, warmup_runs=0)
    print("pool:", log); log.clear()
    from harness.conformance.clauses import running_test_notes
    print("outside when every break kept to vLLM's contract:",
          running_test_notes(clear=True).get("outside_contract", []))
    @eager_on_graph
    def fresh(meta):
        return {"step": meta["step"]}
    capturer.capture(lambda: fresh(meta), warmup_runs=0)
    print("outside after a break returned a new object:", running_test_notes(clear=True).get("outside_contract"))
    log.clear()

    @eager_on_graph
    def captures_again():
        capturer.capture(lambda: None, warmup_runs=0)
    @eager_on_graph
    def takes_a_host_tensor(lengths):
        pass
    for name, body in [("nested", captures_again), ("host tensor", lambda: takes_a_host_tensor(torch.ones(2)))]:
        try:
            capturer.capture(body, warmup_runs=0)
        except Exception as error:
            print(f"{name}:", type(error).__name__, error, "| left active:", BreakableCUDAGraphCapture.current(),
                  "| collector on:", gc.isenabled())
    """, path=extracted)
    lines = {line.partition(": ")[0]: line.partition(": ")[2] for line in result.stdout.splitlines()}
    assert set(lines) >= {"capture", "graph", "replay", "pool", "nested", "host tensor"}, result.stdout + result.stderr
    # Two warm-ups outside any capture (breaks are plain calls), a synchronisation, then vLLM's segments: a
    # graph ended before each break, which runs eagerly, and a new one begun after it, all in the capture's pool.
    assert eval(lines["capture"]) == (
        ["wait"] + ["forward", "attention 0", "inner", "sample 0"] * 2 + ["sync", "begin 0 pool 0", "forward",
         "end 0", "attention 0", "inner", "begin 1 pool 0", "end 1", "sample 0", "begin 2 pool 0", "end 2", "wait"])
    # is_capturing(): in the forward while the capture runs, never inside a break body (warm-ups: no capture)
    assert eval(lines["seen"]) == [("forward", False), ("attention", False), ("inner", False)] * 2 + [
        ("forward", True), ("attention", False), ("inner", False)]
    assert lines["graph"] == "3 2 ['attention', 'sample']"  # vLLM's own counts, the names of its breaks
    # vLLM's replay: segments and breaks in capture order, each break with this replay's state; replay()
    # returns the capture's output object, as vLLM's usage reads it
    assert lines["replay"] == ("True ['replay 0', 'attention 5', 'inner', 'replay 1', 'sample 5', 'replay 2']")
    assert eval(lines["pool"]) == ["wait", "begin 3 pool 1", "end 3", "wait"]  # a pool given is the one used
    # a break returning nothing or its own argument keeps to vLLM's contract; a new object steps outside it, and
    # the conformance report then judges the test under write-back, which vLLM documents away
    assert lines["outside when every break kept to vLLM's contract"] == "[]"
    assert lines["outside after a break returned a new object"] == "['write-back']"
    # vLLM's refusals pass through unchanged, and leave no capture active and the collector on
    assert lines["nested"] == ("RuntimeError Nested BreakableCUDAGraphCapture is not supported. | left active: None "
                               "| collector on: True")
    assert lines["host tensor"] == ("RuntimeError Tensor must be on CUDA device | left active: None "
                                    "| collector on: True")


def test_a_break_result_keeps_to_vllms_contract_only_when_it_is_nothing_or_an_argument():
    from harness.adapters.vllm import _within_contract

    h, other = torch.ones(2), torch.ones(2)
    assert _within_contract(None, (h,))
    assert _within_contract(h, (h, other)) and _within_contract(other, ([h, other],))  # written in place
    assert _within_contract(h, ({"hidden": (other, h)},))  # found inside the containers an argument holds
    assert not _within_contract(h * 2, (h,))  # a new tensor: dropped at replay by vLLM
    assert _within_contract(h[:1], (h,))  # a view of an argument's memory: the caller's buffer, written in place
    assert not _within_contract([h], (h,)) and not _within_contract(3, (3.0,))


@needs_wheel
def test_the_weak_ref_stand_in_says_a_test_rests_on_it(extracted):
    """The conformance report marks a clause whose tests reached a stand-in: the stand-in says so where it stands
    in for vLLM's op (a tensor that reports CUDA stands for a CUDA one here), not for what it passes through."""
    result = _python("""
        import torch
        from harness.conformance.clauses import running_test_notes
        from vllm.utils.torch_utils import weak_ref_tensor, weak_ref_tensors

        class ReportsCuda(torch.Tensor):
            is_cuda = property(lambda self: True)

        weak_ref_tensors([None, torch.zeros(0), 3])  # passed through before the op would be called
        print("passed through:", running_test_notes(clear=True))
        weak_ref_tensor(torch.zeros(3).as_subclass(ReportsCuda))
        print("aliased:", running_test_notes(clear=True))
    """, path=extracted)
    lines = dict(line.partition(": ")[::2] for line in result.stdout.splitlines())
    assert lines.get("passed through") == "{}", result.stdout + result.stderr
    assert eval(lines["aliased"]) == {"stand_ins": [
        "vllm.utils.torch_utils.weak_ref_tensor (an unowned alias built in Python, for vLLM's compiled op)"]}
