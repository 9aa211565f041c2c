"""vLLM's breakable capture under the harness (``--impl graphs=vllm``), on the CPU.

What runs here: ``.ci/gpu/extract-vllm`` on each supported release's wheel (0.33.0 and 0.34.0: its files
unchanged, its stand-ins listed, the capture module importable without a GPU) and its one-line refusal of a
release it cannot extract, the adapter's one-line refusals, the quotes it documents clauses away with (in each
release's module), the set-up the release decides (0.33.0's late-capture guard, which 0.34.0 dropped), and its
bridges driven against vLLM's real ``BreakableCUDAGraphCapture`` with a stand-in CUDA graph (which records and
replays nothing: the order of segments and breaks, the counts, the names and the errors are what it shows). A
release's wheel is found at ``HARNESS_VLLM_WHEEL`` (where named as that release's) or in ``/tmp/vllm-wheel``;
without it its tests skip, saying so. The version bridges are also checked on a fake vllm package, with no wheel.
The suites themselves run against vLLM on a GPU (``.ci/gpu/engine-conformance``).
"""

from __future__ import annotations

import dataclasses
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
from harness.adapters.vllm import BRIDGES, DOCUMENTED_AWAY, VLLM_VERSION, VLLM_VERSIONS, VLLMCapturer
from harness.conformance.clauses import clauses_of
from harness.errors import ImplementationError, UsageError
from harness.graphs import get_backend

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "gpu" / "extract-vllm"
BREAKABLE = "vllm/compilation/breakable_cudagraph.py"
MONITOR = "vllm/compilation/monitor.py"


WHEELS = {version: release_wheel("vllm", version) for version in VLLM_VERSIONS}
needs_no_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                                   reason="vLLM is importable in this environment")


def _script() -> types.ModuleType:
    return extraction_script(SCRIPT)


@dataclasses.dataclass(frozen=True)
class Extraction:
    """A folder made by the script from one release's wheel; ``extracted / name`` is a path in it."""

    folder: Path
    version: str
    wheel: Path

    def __truediv__(self, name: str) -> Path:
        return self.folder / name

    def __str__(self) -> str:
        return str(self.folder)


@pytest.fixture(scope="module", params=VLLM_VERSIONS)
def extracted(request, tmp_path_factory) -> Extraction:
    """The folder of each supported release (a test taking it runs once per release; without the release's wheel,
    that run skips, saying where to put it)."""
    version, wheel = request.param, WHEELS[request.param]
    if wheel is None:
        pytest.skip(needs_release_wheel(None, engine="vllm", name="vLLM", version=version).kwargs["reason"])
    folder = tmp_path_factory.mktemp(f"extract-{version}") / ".vllm"
    completed = subprocess.run([sys.executable, str(SCRIPT), str(wheel), str(folder)], capture_output=True, text=True,
                               timeout=300)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert completed.stdout.startswith(f"{folder}: ") and f"modules of vllm {version} and" in completed.stdout
    return Extraction(folder, version, wheel)


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


def test_extracted_files_are_the_wheels_own_bytes(extracted):
    tables = _script().RELEASES[extracted.version]
    with zipfile.ZipFile(extracted.wheel) as archive:
        for name in tables.extracted:
            assert (extracted / name).read_bytes() == archive.read(name), f"{name} differs from the wheel's"
        # 0.34.0 dropped the late-capture guard: its capture no longer imports monitor, which is not extracted
        guarded = "validate_cudagraph_capturing_enabled" in archive.read(BREAKABLE).decode()
    assert BREAKABLE in tables.extracted
    assert guarded == (MONITOR in tables.extracted) == (extracted.version == "0.33.0")
    assert (BRIDGES[extracted.version].late_capture_guard is not None) == guarded


def test_every_other_file_is_a_stand_in_listed_with_the_wheels_digest(extracted):
    tables = _script().RELEASES[extracted.version]
    folder = extracted.folder
    files = {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}
    assert files == set(tables.extracted) | set(tables.standins) | {"STANDINS.md"}
    assert not set(tables.extracted) & set(tables.standins)
    listing = (extracted / "STANDINS.md").read_text()
    assert hashlib.sha256(extracted.wheel.read_bytes()).hexdigest() in listing and extracted.wheel.name in listing
    assert f"with its tables for vllm {extracted.version}." in listing
    stand_ins = listing.split("Stand-ins", 1)[1]
    for name in tables.standins:
        assert f"- `{name}`" in stand_ins, f"STANDINS.md does not list the stand-in {name}"
        docstring = (extracted / name).read_text()
        # each says what it stands in for (and, past the first line, how it differs)
        assert docstring.startswith('"""Stand-in (harness .ci/gpu/extract-vllm) for '), name
    for name in tables.extracted:
        assert f"- `{name}`" in listing.split("Stand-ins", 1)[0]
    # harness: the weak_ref_tensor stand-in reports itself to the conformance report where the harness is installed
    assert "Installed modules these files import: `harness`, `regex`, `torch`." in listing


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
        # 0.34.0: enabling goes through CompilationConfig.use_breakable_cudagraph (None: the environment variable)
        from vllm.compilation.breakable_cudagraph import is_breakable_cudagraph_enabled
        try:
            from vllm.config import CompilationConfig
        except ImportError:
            print("enabled by", is_breakable_cudagraph_enabled())
        else:
            print("enabled by", [is_breakable_cudagraph_enabled(CompilationConfig(use_breakable_cudagraph=setting))
                                 for setting in (True, False, None)])
    """.replace("FOLDER", repr(str(extracted))), path=extracted)
    out = result.stdout
    assert f"version {extracted.version}" in out and "from the folder True" in out, out + result.stderr
    assert "no capture None" in out and "plain [3.0, 3.0]" in out
    assert "refused Tensor must be on CUDA device" in out and "passed through True 3" in out
    # (the environment variable is unset here: 0.33.0 reads it alone, 0.34.0 where the setting is unresolved)
    enabled = "[True, False, False]" if extracted.version == "0.34.0" else "False"
    assert f"enabled by {enabled}" in out, out + result.stderr


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


def _extract(wheel: Path, dest: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(wheel), str(dest)], capture_output=True, text=True,
                          timeout=60)


def test_the_extraction_refuses_a_wheel_without_the_capture(tmp_path):
    wheel = tmp_path / "vllm-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
    completed = _extract(wheel, tmp_path / "out")
    assert completed.returncode == 1 and not (tmp_path / "out").exists()
    lines = completed.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {wheel.name} cannot be extracted"), completed.stderr
    # older than every supported release: the oldest one's tables, whose first file is missing, and how many more
    assert "it lacks vllm/version.py (and 17 more)" in lines[0] and "those of vllm 0.33.0" in lines[0]
    assert "supported: 0.33.0, 0.34.0" in lines[0]


def _fake_wheel(path: Path, release: str, capture_imports: str) -> Path:
    """A wheel holding every file ``release``'s tables extract, each empty but the version module and the capture
    module, which imports ``capture_imports`` from the folder."""
    with zipfile.ZipFile(path, "w") as archive:
        for name in _script().RELEASES[release].extracted:
            text = {"vllm/version.py": "__version__ = '0'\n__version_tuple__ = (0,)\n",
                    BREAKABLE: capture_imports}.get(name, "")
            archive.writestr(name, text)
    return path


@pytest.mark.parametrize(("wheel_name", "release", "missing"), [
    # a later release whose capture imports a name no stand-in defines: the newest release's tables, and one line
    ("vllm-0.35.0-cp38-abi3-manylinux_2_28_x86_64.whl", "0.34.0", "NewCaptureConfig"),
    # 0.34.0's new import under 0.33.0's tables: the failure the script had on 0.34.0 before it had its tables
    ("vllm-0.33.9-cp38-abi3-manylinux_2_28_x86_64.whl", "0.33.0", "CompilationConfig"),
])
def test_a_release_that_cannot_be_extracted_fails_in_one_line_naming_what_is_missing(tmp_path, wheel_name, release,
                                                                                   missing):
    imports = f"from vllm.config import CUDAGraphMode, VllmConfig, {missing}\n"
    wheel = _fake_wheel(tmp_path / wheel_name, release, imports)
    completed = _extract(wheel, tmp_path / "out")
    assert completed.returncode == 1 and not (tmp_path / "out").exists() and completed.stdout == ""
    lines = completed.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in completed.stderr, completed.stderr
    assert lines[0] == (f"error: {wheel_name} cannot be extracted for --impl graphs=vllm: {BREAKABLE}:1: imports "
                        f"{missing} from vllm.config, which does not define it; the folder's tables are those of vllm "
                        f"{release} (supported: 0.33.0, 0.34.0)")
    # the same fake with the release's own imports is extracted: the line above is about the name, nothing else
    assert _extract(_fake_wheel(tmp_path / wheel_name, release, "from vllm.config import CUDAGraphMode\n"),
                    tmp_path / "out").returncode == 0


def test_a_file_that_is_no_wheel_fails_in_one_line(tmp_path):
    wheel = tmp_path / "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"not a zip archive")
    completed = _extract(wheel, tmp_path / "out")
    assert completed.returncode == 1 and len(completed.stderr.splitlines()) == 1, completed.stderr
    assert "BadZipFile" in completed.stderr and "Traceback" not in completed.stderr


def test_the_release_decides_the_tables():
    script = _script()
    assert set(script.RELEASES) == set(VLLM_VERSIONS) == set(BRIDGES)
    assert [script.release_for(version) for version in ("0.33.0", "0.34.0", "0.34.2", "0.35.0rc1", "0.33.1", "0.20.0")
            ] == ["0.33.0", "0.34.0", "0.34.0", "0.34.0", "0.33.0", "0.33.0"]
    # only 0.34.0's configuration stand-in has CompilationConfig, and only 0.33.0 extracts the guard's module
    configs = {release: tables.standins["vllm/config/__init__.py"] for release, tables in script.RELEASES.items()}
    assert ["class CompilationConfig" in configs[release] for release in VLLM_VERSIONS] == [False, True]
    assert [MONITOR in script.RELEASES[release].extracted for release in VLLM_VERSIONS] == [True, False]


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


def test_the_weak_ref_stand_in_says_a_test_rests_on_it(extracted):
    """The conformance report marks a clause whose tests reached a stand-in: the stand-in says so where it stands
    in for vLLM's op (a tensor that reports CUDA stands for a CUDA one here), not for what it passes through."""
    result = _python("""
        import torch
        from harness.conformance.clauses import running_test_notes
        from vllm.utils.torch_utils import weak_ref_tensor, weak_ref_tensors

        class ReportsCuda(torch.Tensor):
            is_cuda = property(lambda self: True)

        weak_ref_tensors([torch.zeros(0), 3])  # passed through before the op would be called
        weak_ref_tensor(None)
        print("passed through:", running_test_notes(clear=True))
        weak_ref_tensor(torch.zeros(3).as_subclass(ReportsCuda))
        print("aliased:", running_test_notes(clear=True))
    """, path=extracted)
    lines = dict(line.partition(": ")[::2] for line in result.stdout.splitlines())
    assert lines.get("passed through") == "{}", result.stdout + result.stderr
    assert eval(lines["aliased"]) == {"stand_ins": [
        "vllm.utils.torch_utils.weak_ref_tensor (an unowned alias built in Python, for vLLM's compiled op)"]}


# --- what the release decides ------------------------------------------------------------------------


def test_the_late_capture_guard_is_called_where_the_release_has_one(extracted):
    """0.33.0's BreakableCUDAGraphWrapper calls validate_cudagraph_capturing_enabled before each capture, which
    raises once the model runner has turned capturing off after start-up; the adapter calls it where the wrapper
    does. 0.34.0 has no such guard (its capture does not import monitor, which the folder then lacks): a capture
    after start-up goes ahead."""
    result = _python(_STAND_IN_CUDA + """
    capturer = VLLMCapturer(CudaBackend())
    print("version:", capturer.version)
    try:
        from vllm.compilation.monitor import set_cudagraph_capturing_enabled
    except ImportError as error:
        print("guard:", type(error).__name__)
    else:
        set_cudagraph_capturing_enabled(False)  # what vLLM's model runner does once start-up capture is over
        print("guard: present")
    try:
        graph = capturer.capture(lambda: torch.ones(1), warmup_runs=0)
    except RuntimeError as error:
        print("late capture:", error, "| log:", log)
    else:
        print("late capture: captured", graph.segment_count, "| log:", log)
    """, path=extracted)
    lines = dict(line.partition(": ")[::2] for line in result.stdout.splitlines())
    assert lines.get("version") == extracted.version, result.stdout + result.stderr
    if extracted.version == "0.33.0":
        assert lines["guard"] == "present"
        # refused before vLLM's capture context began a segment
        assert lines["late capture"] == ("CUDA graph capturing detected at an inappropriate time. This operation is "
                                         "currently disabled. | log: ['wait', 'wait']")
    else:
        assert lines["guard"] == "ModuleNotFoundError"
        assert lines["late capture"] == "captured 1 | log: ['wait', 'begin 0 pool 0', 'end 0', 'wait']"


def _fake_vllm(root: Path, version: str) -> Path:
    """A fake vllm package of ``version``: a capture context that logs, no break decorator work, and (where the
    release had one) a monitor whose guard logs; no wheel needed."""
    package = root / "vllm"
    (package / "compilation").mkdir(parents=True)
    (package / "__init__.py").write_text(f"__version__ = {version!r}\nlog = []\n")
    (package / "compilation" / "__init__.py").write_text("")
    (package / "compilation" / "breakable_cudagraph.py").write_text(textwrap.dedent("""
        from vllm import log

        class BreakableCUDAGraphCapture:
            def __init__(self, pool=None):
                self.num_graphs = self.num_eager_breaks = 0
            def __enter__(self):
                log.append("capture begins")
                return self
            def __exit__(self, *exc):
                log.append("capture ends")

        def eager_break_during_capture(fn):
            return fn
    """))
    if BRIDGES.get(version) is None or BRIDGES[version].late_capture_guard is not None:
        (package / "compilation" / "monitor.py").write_text(
            "from vllm import log\ndef validate_cudagraph_capturing_enabled():\n    log.append('guard')\n")
    return root


@pytest.mark.parametrize("version", [*VLLM_VERSIONS, "0.34.0+cu130"])
def test_the_imported_release_decides_the_set_up(tmp_path, version):
    result = _python(_STAND_IN_CUDA.replace(
        "from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture", "import vllm") + """
    import sys
    from harness.adapters.vllm import engine_version, load_capturer
    print("version:", engine_version())
    print("loaded:", load_capturer(graph_backend="cuda").__name__)
    capturer = VLLMCapturer(CudaBackend())
    capturer.capture(lambda: None, warmup_runs=0)
    capturer.capture(lambda: None, warmup_runs=0)
    print("calls:", vllm.log)
    print("monitor imported:", "vllm.compilation.monitor" in sys.modules)
    """, path=_fake_vllm(tmp_path, version))
    lines = dict(line.partition(": ")[::2] for line in result.stdout.splitlines())
    assert lines.get("version") == version and lines["loaded"] == "VLLMCapturer", result.stdout + result.stderr
    guarded = version == "0.33.0"
    each = ["guard"] * guarded + ["capture begins", "capture ends"]
    assert eval(lines["calls"]) == each * 2  # the guard before each capture context, where the release has one
    assert lines["monitor imported"] == str(guarded)


def test_another_release_is_refused_in_one_line(tmp_path, monkeypatch, forget_vllm):
    monkeypatch.syspath_prepend(str(_fake_vllm(tmp_path, "0.35.0")))
    with pytest.raises(ImplementationError) as raised:
        impls.load("graphs", "vllm", graph_backend="cuda")
    assert str(raised.value) == (
        "--impl graphs=vllm: the vLLM imported here is 0.35.0; the adapter bridges vLLM 0.33.0 and 0.34.0 only "
        "(harness/adapters/vllm.py, BRIDGES): extract one of those with .ci/gpu/extract-vllm, or pip install "
        "vllm==0.34.0")
