"""TensorRT-LLM's breakable CUDA graph under the harness (``--impl graphs=trtllm``), on the CPU.

What runs here: ``.ci/gpu/extract-trtllm`` on a small git repository made by the tests (the files of the named
commit, not of a later one; their blob ids listed; the commit resolved; what it refuses) and on TensorRT-LLM's own
source where it is found (``HARNESS_TRTLLM_SOURCE``, else ``/tmp/trtllm-src``; without it those tests skip, saying
so); the adapter's one-line refusals; the make_weak_ref stand-in's description of a tensor's memory; and the
adapter's bridges driven against TensorRT-LLM's real ``BreakableCUDAGraphCapture`` with a stand-in CUDA graph and
a stand-in cuda-python (which record and replay nothing: the order of segments and breaks, the counts, the names
and the errors are what they show). The suites themselves run against TensorRT-LLM on a GPU
(``.ci/gpu/engine-conformance``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_releases import STAND_IN_CUDA_PATCHES, engine_source, extraction_script, needs_engine_source

from harness import conformance, impls
from harness.adapters.trtllm import (
    DOCUMENTED_AWAY,
    LATER_COMMIT,
    TRTLLM_COMMIT,
    TRTLLMCapturer,
    break_marker,
    engine_version,
)
from harness.errors import ImplementationError, UsageError
from harness.graphs import get_backend

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "gpu" / "extract-trtllm"
BREAKABLE = "tensorrt_llm/_torch/pyexecutor/breakable_cuda_graph"

SOURCE = engine_source("trtllm")
needs_source = needs_engine_source(SOURCE, engine="trtllm", name="TensorRT-LLM",
                                   repository="https://github.com/NVIDIA/TensorRT-LLM")


def _script() -> types.ModuleType:
    return extraction_script(SCRIPT)


def _extract(source: Path, commit: str, dest: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(source), commit, str(dest)], capture_output=True,
                          text=True, timeout=120)


def _git(repo: Path, *arguments: str) -> str:
    environment = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                       GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", "-C", str(repo), *arguments], check=True, capture_output=True, text=True,
                          env=environment).stdout.strip()


# Made-up modules at the extracted paths, importing what TensorRT-LLM's do (its make_weak_ref, cuda-python): what
# the script does with them is under test, not what they compute.
_FAKE = {
    f"{BREAKABLE}/__init__.py": "from .breakable_cuda_graph import BreakableCUDAGraph, eager_on_graph\n"
                                "from .context import enable_breakable_cuda_graph\n",
    f"{BREAKABLE}/breakable_cuda_graph.py": "from cuda.bindings import runtime as rt\n"
                                            "from ...utils import make_weak_ref\n"
                                            "VERSION = {version}\n"
                                            "class BreakableCUDAGraph: ...\n"
                                            "def eager_on_graph(enable): ...\n",
    f"{BREAKABLE}/context.py": "def enable_breakable_cuda_graph(): ...\n",
    f"{BREAKABLE}/cuda_utils.py": "import torch\n",
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> tuple[Path, str, str]:
    """A git repository with the extracted paths: (its folder, the first commit, a later one changing a file)."""
    repo = tmp_path_factory.mktemp("trtllm-repo")
    _git(repo, "init", "-q")
    for version in (1, 2):
        for name, text in _FAKE.items():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_text(text.replace("{version}", str(version)))
        _git(repo, "add", ".")
        _git(repo, "commit", "-q", "-m", f"version {version}")
    return repo, _git(repo, "rev-parse", "HEAD~1"), _git(repo, "rev-parse", "HEAD")


# --- the extraction --------------------------------------------------------------------------------


def test_the_extraction_takes_the_named_commits_files_and_lists_their_blob_ids(repository, tmp_path):
    repo, first, _ = repository
    for source in (repo, repo / ".git"):  # a checkout or its git directory (a bare mirror is one)
        folder = tmp_path / source.name / ".trtllm"
        completed = _extract(source, first[:10], folder)  # an abbreviation is resolved to the whole commit
        assert completed.returncode == 0, completed.stderr
        assert f"at {first[:12]} and 4 stand-ins" in completed.stdout
        assert "is not the one the adapter targets" in completed.stderr
        for name in _FAKE:
            assert (folder / name).read_text() == _FAKE[name].replace("{version}", "1")  # not the later commit's
        listing = (folder / "STANDINS.md").read_text()
        assert f"at commit `{first}` (resolved in git)" in listing
        for name in _FAKE:
            assert f"- `{name}` (blob `{_git(repo, 'rev-parse', f'{first}:{name}')}`)" in listing
        assert "Installed modules these files import: `cuda`, `harness`, `torch`." in listing
        assert f'__commit__ = "{first}"' in (folder / "tensorrt_llm/__init__.py").read_text()
    files = {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}
    script = _script()
    assert set(_FAKE) == set(script.EXTRACTED)
    assert files == set(script.EXTRACTED) | set(script.STANDINS) | {"STANDINS.md"}


def test_the_extraction_refuses_what_it_cannot_pin_or_provide(repository, tmp_path):
    repo, first, later = repository
    completed = _extract(repo, "0" * 40, tmp_path / "a")
    assert completed.returncode == 1 and f"commit {'0' * 40} is not in {repo / '.git'}" in completed.stderr
    completed = _extract(repo, "not-a-commit", tmp_path / "a")
    assert completed.returncode == 1 and "COMMIT must be a commit id" in completed.stderr
    # a plain folder cannot say its commit: only a whole commit id is taken, and STANDINS.md says it is as stated
    plain = tmp_path / "plain"
    for name in _FAKE:
        (plain / name).parent.mkdir(parents=True, exist_ok=True)
        (plain / name).write_text((repo / name).read_text())
    completed = _extract(plain, later[:12], tmp_path / "b")
    assert completed.returncode == 1 and "give the whole 40-digit commit id" in completed.stderr
    assert _extract(plain, later, tmp_path / "b").returncode == 0
    assert f"at commit `{later}` (stated, not checked: a folder)" in (tmp_path / "b" / "STANDINS.md").read_text()
    (plain / f"{BREAKABLE}/context.py").unlink()
    completed = _extract(plain, later, tmp_path / "c")
    assert completed.returncode == 1 and f"lacks {BREAKABLE}/context.py" in completed.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()


def test_an_import_the_folder_does_not_provide_stops_the_extraction(tmp_path):
    """A commit whose breakable graph imports something new fails at extraction, naming the import."""
    plain = tmp_path / "plain"
    for name, text in _FAKE.items():
        (plain / name).parent.mkdir(parents=True, exist_ok=True)
        (plain / name).write_text(text.replace("{version}", "3").replace(
            "from ...utils import make_weak_ref", "from ...utils import make_weak_ref, weak_ref_tensors\n"
                                                  "from ..trace_log_utils import log_mem_snapshot"))
    completed = _extract(plain, TRTLLM_COMMIT, tmp_path / "out")
    assert completed.returncode == 1 and not (tmp_path / "out").exists()
    assert f"{BREAKABLE}/breakable_cuda_graph.py:2: imports weak_ref_tensors from tensorrt_llm._torch.utils, " \
           "which does not define it" in completed.stderr
    assert f"{BREAKABLE}/breakable_cuda_graph.py:3: imports tensorrt_llm._torch.pyexecutor.trace_log_utils, " \
           "which the folder does not provide" in completed.stderr
    assert "is not the one the adapter targets" not in completed.stderr


def test_the_script_targets_the_adapters_commit():
    assert _script().TARGET_COMMIT == TRTLLM_COMMIT


@pytest.fixture(scope="module")
def extracted(tmp_path_factory) -> Path:
    """The folder made from TensorRT-LLM's own source at the adapter's commit."""
    if SOURCE is None:
        pytest.skip("no TensorRT-LLM source (see needs_source)")
    folder = tmp_path_factory.mktemp("extract") / ".trtllm"
    completed = _extract(SOURCE, TRTLLM_COMMIT, folder)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return folder


@needs_source
def test_the_extracted_files_are_the_sources_own_bytes(extracted):
    git_dir = _script()._git_dir(SOURCE)
    for name in _script().EXTRACTED:
        expected = (SOURCE / name).read_bytes() if git_dir is None else subprocess.run(
            ["git", f"--git-dir={git_dir}", "show", f"{TRTLLM_COMMIT}:{name}"], check=True, capture_output=True).stdout
        assert (extracted / name).read_bytes() == expected, f"{name} differs from the source's"


# --- the adapter -----------------------------------------------------------------------------------


@pytest.fixture
def forget_trtllm():
    """Drop whatever an adapter imported of an extracted tensorrt_llm package, so other tests see none."""
    yield
    for name in [name for name in sys.modules if name == "tensorrt_llm" or name.startswith("tensorrt_llm.")]:
        del sys.modules[name]


def test_selecting_trtllm_without_its_modules_names_the_extract_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRTLLM_MODULES", raising=False)
    with pytest.raises(ImplementationError) as raised:
        impls.load("graphs", "trtllm", graph_backend="cuda")
    message = str(raised.value)
    assert "\n" not in message and message.startswith("--impl graphs=trtllm needs TensorRT-LLM's modules")
    assert f"there is no folder .trtllm: .ci/gpu/extract-trtllm SOURCE {TRTLLM_COMMIT} .trtllm makes it" in message
    (tmp_path / ".trtllm" / "tensorrt_llm").mkdir(parents=True)
    with pytest.raises(ImplementationError, match=r"the folder \.trtllm holds them but is not on PYTHONPATH"):
        impls.load("graphs", "trtllm", graph_backend="emulated")


def test_a_missing_cuda_python_is_named_in_one_line(repository, tmp_path, monkeypatch, forget_trtllm):
    repo, first, _ = repository
    assert _extract(repo, first, tmp_path / ".trtllm").returncode == 0
    monkeypatch.syspath_prepend(str(tmp_path / ".trtllm"))
    monkeypatch.setitem(sys.modules, "cuda", None)  # not importable, whether or not it is installed here
    with pytest.raises(ImplementationError) as raised:
        impls.load("graphs", "trtllm", graph_backend="cuda")
    assert str(raised.value) == (
        f"--impl graphs=trtllm: importing TensorRT-LLM's {BREAKABLE.replace('/', '.')} failed: it imports "
        "'cuda.bindings', which is not installed (cuda-python: pip install cuda-bindings, or carry its wheel in .whl/)")


def test_the_trtllm_adapter_refuses_a_backend_other_than_cuda(repository, tmp_path, monkeypatch, forget_trtllm):
    repo, first, _ = repository
    assert _extract(repo, first, tmp_path / ".trtllm").returncode == 0
    monkeypatch.syspath_prepend(str(tmp_path / ".trtllm"))
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))  # the made-up module imports cuda.bindings
    monkeypatch.setitem(sys.modules, "cuda.bindings", types.SimpleNamespace(runtime=None))
    with pytest.raises(UsageError) as raised:
        impls.load("graphs", "trtllm", graph_backend="emulated")
    assert str(raised.value) == (
        "--impl graphs=trtllm captures real CUDA graphs with TensorRT-LLM's BreakableCUDAGraph, which the emulated "
        "backend cannot stand in for: run with --device cuda --graph-backend cuda on a GPU")
    with pytest.raises(UsageError, match="--graph-backend cuda"):
        TRTLLMCapturer(get_backend("emulated"))
    assert impls.load("graphs", "trtllm", graph_backend="cuda").obj is TRTLLMCapturer
    # the report names the code by the commit the folder was extracted at
    assert engine_version() == f"commit {first[:12]}"
    assert conformance._engine("graphs", "trtllm") == f"trtllm commit {first[:12]}"


def test_nothing_is_documented_away():
    """TensorRT-LLM's module states no narrower contract: every clause is judged as it stands."""
    assert DOCUMENTED_AWAY == {} and conformance.documented_away("graphs", "trtllm") == ()


# --- the two forms of eager_on_graph ------------------------------------------------------------------


def _fake_breakable(form: str) -> types.SimpleNamespace:
    """A made-up breakable module with an ``eager_on_graph`` of one form: ``factory`` (called with the flag, as at
    TRTLLM_COMMIT), ``decorator`` (called with the function, as at LATER_COMMIT), each by the parameter names of
    those commits or, with ``-annotated``, by other names and the annotations only. ``calls`` logs what the module
    was asked; its graph counts the breaks its wrapper ran."""
    calls: list[tuple[str, Any]] = []
    graphs: list[Any] = []

    class BreakableCUDAGraph:
        def __init__(self) -> None:
            self.num_breaks = 0
            graphs.append(self)

    def wrap(inner: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for graph in graphs[-1:]:  # the graph begun last, where one was
                graph.num_breaks += 1
            calls.append(("break", args))
            return inner(*args, **kwargs)
        return wrapper

    def factory(enable: bool) -> Callable[..., Any]:
        calls.append(("factory", enable))
        return wrap if enable else (lambda inner: inner)

    def factory_annotated(flag: bool) -> Callable[..., Any]:
        return factory(flag)

    def decorator(inner: Callable[..., Any]) -> Callable[..., Any]:
        calls.append(("decorate", inner))
        return wrap(inner)

    def decorator_annotated(fn: Callable[..., Any]) -> Callable[..., Any]:
        return decorator(fn)

    forms = {"factory": factory, "factory-annotated": factory_annotated, "decorator": decorator,
             "decorator-annotated": decorator_annotated}
    return types.SimpleNamespace(BreakableCUDAGraph=BreakableCUDAGraph, eager_on_graph=forms[form], calls=calls)


@pytest.mark.parametrize("form", ["factory", "factory-annotated"])
def test_a_factory_eager_on_graph_is_called_with_true_once(form):
    fake = _fake_breakable(form)
    mark = break_marker(fake)
    assert fake.calls == [("factory", True)]  # asked for the decorator, nothing decorated yet
    assert mark(lambda x: x * 3)(2) == 6 and fake.calls[1:] == [("break", (2,))]


@pytest.mark.parametrize("form", ["decorator", "decorator-annotated"])
def test_a_plain_eager_on_graph_decorates_the_break_itself(form):
    fake = _fake_breakable(form)
    mark = break_marker(fake)
    assert mark is fake.eager_on_graph and fake.calls == []  # not called with True, which it would wrap as a function

    def body(x):
        return x + 1

    assert mark(body)(4) == 5 and fake.calls == [("decorate", body), ("break", (4,))]


@pytest.mark.parametrize("form", ["factory", "decorator"])
def test_the_capturer_counts_breaks_through_either_form(form):
    fake = _fake_breakable(form)
    capturer = object.__new__(TRTLLMCapturer)  # no backend: only begin and the break receiver run
    capturer._breakable = fake
    graph, breaks = capturer.begin(pool=None)
    assert isinstance(graph, fake.BreakableCUDAGraph)

    def attention(h):
        return h * 2

    assert breaks.run_break(attention, (torch.ones(2),), {}).tolist() == [2.0, 2.0]
    assert graph.num_breaks == 1 and breaks.engine_breaks() == 1
    assert breaks.names == [attention.__qualname__]


def test_an_eager_on_graph_of_neither_form_is_refused_in_one_line():
    def eager_on_graph(function, enable=True):  # two parameters: neither commit's form
        return function

    with pytest.raises(ImplementationError) as raised:
        break_marker(types.SimpleNamespace(eager_on_graph=eager_on_graph))
    message = str(raised.value)
    assert "\n" not in message and message.startswith("--impl graphs=trtllm: TensorRT-LLM's eager_on_graph(function, ")
    assert f"factory eager_on_graph(enable) of commit {TRTLLM_COMMIT[:12]}" in message
    assert f"decorator eager_on_graph(inner) of commit {LATER_COMMIT[:12]}" in message


# --- the make_weak_ref stand-in ------------------------------------------------------------------------


def _stand_in_utils() -> types.ModuleType:
    module = types.ModuleType("trtllm_utils_stand_in")
    exec(compile(_script().STANDINS["tensorrt_llm/_torch/utils.py"], "utils.py", "exec"), module.__dict__)
    return module


def test_the_make_weak_ref_stand_in_describes_the_tensors_memory_as_trtllms_wrapper():
    """TensorRT-LLM's alias is made from __cuda_array_interface__; the same description read through numpy's
    host-side interface on the CPU shows the alias's elements: the same memory, sizes, strides and values."""
    numpy = pytest.importorskip("numpy")
    utils = _stand_in_utils()
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float64):
        base = torch.arange(35).reshape(5, 7).to(dtype)
        view = base[1:, 2:5].t()  # offset and transposed
        described = utils._Described(view).__cuda_array_interface__
        assert described["data"] == (view.data_ptr(), False) and described["version"] == 3

        class Host:
            __array_interface__ = {key: described[key] for key in ("shape", "typestr", "data", "strides", "version")}

        alias = torch.from_numpy(numpy.asarray(Host())).view(dtype)
        assert alias.data_ptr() == view.data_ptr() and alias.shape == view.shape and alias.stride() == view.stride()
        assert torch.equal(alias, view)
    empty = utils._Described(torch.zeros(4)[2:2]).__cuda_array_interface__  # at pointer 0, as TensorRT-LLM's
    assert empty["data"] == (0, False) and empty["shape"] == (0,)


def test_the_make_weak_ref_stand_in_routes_values_as_trtllms_and_says_a_test_rests_on_it():
    from harness.conformance.clauses import running_test_notes

    utils = _stand_in_utils()
    running_test_notes(clear=True)
    host = torch.ones(2)
    held = utils.make_weak_ref(({"a": host}, [host, 3, 2.5, True]))  # off CUDA: held as it is
    assert held[0]["a"] is host and held[1][0] is host and held[1][1:] == [3, 2.5, True]
    with pytest.raises(TypeError, match="Invalid type <class 'NoneType'> to make weak ref"):
        utils.make_weak_ref(None)
    assert running_test_notes(clear=True) == {}

    class ReportsCuda(torch.Tensor):
        is_cuda = property(lambda self: True)

    with pytest.warns(UserWarning, match="make_weak_ref stand-in: kept a strong reference"):
        utils.make_weak_ref(torch.zeros(3).as_subclass(ReportsCuda))  # this torch has no CUDA to alias with
    assert running_test_notes(clear=True) == {"stand_ins": [utils._NAME]}


def test_the_make_weak_ref_stand_in_takes_the_later_commits_preserve_unsupported():
    """LATER_COMMIT passes every break argument with preserve_unsupported=True: other types come back as they are
    (inside containers too); without the flag they are refused as before."""
    utils = _stand_in_utils()
    marker, host = object(), torch.ones(2)
    held = utils.make_weak_ref({"m": marker, "xs": [None, host]}, preserve_unsupported=True)
    assert held["m"] is marker and held["xs"][0] is None and held["xs"][1] is host
    assert utils.make_weak_ref(marker, preserve_unsupported=True) is marker
    with pytest.raises(TypeError, match="Invalid type <class 'object'> to make weak ref"):
        utils.make_weak_ref([marker])


# --- the bridges, against TensorRT-LLM's capture ----------------------------------------------------------


def _python(code: str, *, path: Path) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with the folder first on PYTHONPATH (the imported tensorrt_llm and the
    torch.cuda and cuda-python stand-ins must not leak into other tests)."""
    environment = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), str(ROOT), os.environ.get("PYTHONPATH", ""))
                                                if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=300)


# torch.cuda's stream, device, pool and graph calls replaced by stand-ins that log (a graph whose capture has ended
# refuses to end again, as CUDA refuses to end the capture of a stream that is not capturing), cuda-python by the
# names the breakable graph reads at import, TensorRT-LLM's capture as extracted, the adapter as shipped.
_STAND_IN_CUDA = """
    import contextlib, gc, itertools, sys, types
    import torch
    runtime = types.ModuleType("cuda.bindings.runtime")
    runtime.cudaError_t = type("cudaError_t", (), {"cudaSuccess": 0})
    runtime.cudaStreamCaptureStatus = type("cudaStreamCaptureStatus", (), {"cudaStreamCaptureStatusActive": 1})
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = runtime
    sys.modules.update({"cuda": types.ModuleType("cuda"), "cuda.bindings": bindings, "cuda.bindings.runtime": runtime})
    log = []
    class Stream:
        cuda_stream = 1
        def __init__(self, device=None): pass
        def wait_stream(self, other): log.append("wait")
    class Graph:
        ids = itertools.count()
        def __init__(self): self.id, self.capturing = next(Graph.ids), False
        def capture_begin(self, pool=None, capture_error_mode=None):
            self.capturing = True
            log.append(f"begin {self.id} pool {pool[1]} {capture_error_mode}")
        def capture_end(self):
            if not self.capturing:
                raise RuntimeError("CUDA error: operation not permitted when stream is not capturing")
            self.capturing = False
            log.append(f"end {self.id}")
        def replay(self): log.append(f"replay {self.id}")
        def reset(self): log.append(f"reset {self.id}")
""" + STAND_IN_CUDA_PATCHES + """
    from harness.adapters.trtllm import TRTLLMCapturer
    from harness.graphs import eager_on_graph, is_capturing
    from tensorrt_llm._torch.pyexecutor.breakable_cuda_graph import is_in_breakable_cuda_graph
"""


@needs_source
def test_the_adapter_drives_trtllms_capture_with_a_stand_in_cuda_graph(extracted):
    result = _python(_STAND_IN_CUDA + """
    seen = []  # is_capturing() (the harness's) and TensorRT-LLM's is_in_breakable_cuda_graph() where each runs
    @eager_on_graph
    def attention(meta, h):
        log.append(f"attention {meta['step']} {h.item():g}")
        seen.append(("attention", is_capturing(), is_in_breakable_cuda_graph()))
        return meta
    @eager_on_graph
    def sample(meta):
        log.append(f"sample {meta['step']}")
    meta, h = {"step": 0}, torch.zeros(())
    def forward():
        log.append("forward")
        seen.append(("forward", is_capturing(), is_in_breakable_cuda_graph()))
        attention(meta, h)
        sample(meta)
        return meta
    capturer = TRTLLMCapturer(CudaBackend())
    graph = capturer.capture(forward, pool=None, warmup_runs=2)
    print("capture:", log); log.clear()
    print("seen:", seen); seen.clear()
    print("graph:", graph.segment_count, graph.break_count, graph.break_names)
    meta["step"] = 5
    h.fill_(5)
    print("replay:", graph.replay() is meta is graph.output, log, seen); log.clear(); seen.clear()
    capturer.capture(lambda: None, pool=capturer.new_pool(), warmup_runs=0)
    print("pool:", log); log.clear()

    @eager_on_graph
    def inner():
        log.append("inner")
    @eager_on_graph
    def outer():
        inner()  # a break inside a break body goes to TensorRT-LLM's decorator, which ends the segment again
    @eager_on_graph
    def captures_again():
        capturer.capture(lambda: None, warmup_runs=0)
    for name, body in [("nested break", outer), ("nested capture", captures_again)]:
        try:
            nested = capturer.capture(body, warmup_runs=0)
            print(f"{name}:", "captured", nested.segment_count, nested.break_count, "| log:", log)
        except Exception as error:
            print(f"{name}:", type(error).__name__, error, "| log:", log, "| collector on:", gc.isenabled(),
                  "| wait_stream restored:", Stream.wait_stream.__name__)
        log.clear()
    """, path=extracted)
    lines = {line.partition(": ")[0]: line.partition(": ")[2] for line in result.stdout.splitlines()}
    assert set(lines) >= {"capture", "seen", "graph", "replay", "pool", "nested break", "nested capture"}, \
        result.stdout + result.stderr
    # Two warm-ups on the capture stream (breaks are plain calls), no synchronisation, then TensorRT-LLM's segments:
    # one ended before each break, which runs eagerly, and one begun after it, all in one pool, in global mode.
    assert eval(lines["capture"]) == (
        ["wait"] + ["forward", "attention 0 0", "sample 0"] * 2 + ["begin 0 pool 0 global", "forward", "end 0",
         "attention 0 0", "begin 1 pool 0 global", "end 1", "sample 0", "begin 2 pool 0 global", "end 2", "wait"])
    # the harness's is_capturing(): in the forward while the capture runs, never in a break body; TensorRT-LLM's
    # is_in_breakable_cuda_graph(): throughout the capture, as its runner's capture_context sets it
    assert eval(lines["seen"]) == [("forward", False, False), ("attention", False, False)] * 2 + [
        ("forward", True, True), ("attention", False, True)]
    assert lines["graph"] == "3 2 ['attention', 'sample']"  # TensorRT-LLM's own counts, the names of its breaks
    # TensorRT-LLM's replay: segments and breaks in capture order, inside enable_breakable_cuda_graph() as its
    # runner's execute replays. A break's tensor arguments are its own (make_weak_ref holds a tensor off CUDA as it
    # is; on CUDA an alias of the same memory), so it reads the tensor's state at this replay; a dict argument is
    # the copy _weak_ref_if_tensor made at capture, so it reads the capture-time members (step 0, not 5): what the
    # suites' live-breaks tests check on the GPU.
    assert lines["replay"] == ("True ['replay 0', 'attention 0 5', 'replay 1', 'sample 0', 'replay 2'] "
                               "[('attention', False, True)]")
    assert eval(lines["pool"]) == ["wait", "begin 3 pool 1 global", "end 3", "wait"]  # a pool given is the one used
    # What TensorRT-LLM does with a break inside a break body (its decorator ends the ended segment again: the
    # refusal CUDA gives, the graph reset as its runner resets one) and with a capture begun from a break body (it
    # captures it); the harness's collector and TensorRT-LLM's wait_stream hook are restored either way
    nested = lines["nested break"]
    assert nested.startswith("RuntimeError CUDA error: operation not permitted when stream is not capturing | log: ")
    assert nested.endswith("| collector on: True | wait_stream restored: wait_stream")
    assert "'reset 4'" in nested and "inner" not in nested
    assert lines["nested capture"].startswith("captured 2 1 | log: ")
