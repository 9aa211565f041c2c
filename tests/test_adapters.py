"""Engine adapters (harness.adapters): selection, and the one-line errors where the engine is missing.

SGLang cannot be installed in CI (CUDA dependencies), so what runs here is its import-time errors,
and, where a folder of SGLang's modules is given (``HARNESS_SGLANG_MODULES``, made by
``.ci/gpu/extract-sglang``), the adapters' bridges against the release's real modules on the CPU.
The suites themselves run against SGLang on a GPU (``.ci/gpu/sglang-conformance``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import cli, impls
from harness.adapters.sglang import SGLangCapturer
from harness.errors import ImplementationError, UsageError
from harness.graphs import get_backend

ROOT = Path(__file__).resolve().parent.parent
SGLANG_MODULES = os.environ.get("HARNESS_SGLANG_MODULES", "")
needs_sglang_modules = pytest.mark.skipif(
    not (SGLANG_MODULES and (Path(SGLANG_MODULES) / "sglang").is_dir()),
    reason="no SGLang modules here: set HARNESS_SGLANG_MODULES to a folder made by .ci/gpu/extract-sglang "
           "from the sglang 0.5.23 wheel (SGLang itself needs CUDA to install)")


def _python(code: str, *, path: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (an imported sglang must not leak into other tests)."""
    environment = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **(env or {}))
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (path, str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=300)


def _sglang_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang") is not None


needs_no_sglang = pytest.mark.skipif(_sglang_importable(), reason="SGLang is importable in this environment")


@pytest.fixture
def forget_sglang():
    """Drop whatever an adapter imported of a stand-in sglang package, so other tests see none."""
    yield
    for name in [name for name in sys.modules if name == "sglang" or name.startswith("sglang.")]:
        del sys.modules[name]


@needs_no_sglang
@pytest.mark.parametrize("component", ["graphs", "gather"])
def test_selecting_an_adapter_without_the_engine_says_what_to_install(component):
    with pytest.raises(ImplementationError) as raised:
        impls.load(component, "sglang", graph_backend="cuda")
    message = str(raised.value)
    assert "\n" not in message and f"--impl {component}=sglang needs SGLang" in message
    assert "pip install sglang==0.5.23" in message


def _stand_in_sglang(root: Path, module: str, text: str) -> None:
    """A package ``sglang`` under ``root`` holding ``module`` (dotted, below sglang) with ``text``."""
    *packages, name = ["sglang", *module.split(".")]
    folder = root
    for package in packages:
        folder = folder / package
        folder.mkdir(exist_ok=True)
        (folder / "__init__.py").write_text("")
    (folder / f"{name}.py").write_text(text)


@needs_no_sglang
def test_a_missing_engine_dependency_is_named(tmp_path, monkeypatch, forget_sglang):
    _stand_in_sglang(tmp_path, "kernels.ops.speculative.gather_spec_extras", "import sgl_kernel_that_is_not_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImplementationError, match="imports 'sgl_kernel_that_is_not_here', which is not installed"):
        impls.load("gather", "sglang")


@needs_no_sglang
def test_the_graphs_adapter_refuses_a_backend_other_than_cuda(tmp_path, monkeypatch, forget_sglang):
    _stand_in_sglang(tmp_path, "srt.model_executor.runner_backend_utils.breakable_cuda_graph", "")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UsageError, match="captures real CUDA graphs .* run with --device cuda --graph-backend cuda"):
        impls.load("graphs", "sglang", graph_backend="emulated")
    with pytest.raises(UsageError, match="--graph-backend cuda"):
        SGLangCapturer(get_backend("emulated"))


def test_the_adapters_are_listed_but_their_engine_is_not_imported(capsys):
    impls.implementations("graphs")
    impls.implementations("gather")
    cli.main(["list", "--component", "graphs"])
    listed = capsys.readouterr().out
    assert "(--impl graphs=sglang, the engine's shipped code)" in listed
    assert "harness.adapters.vllm:load_capturer  (--impl graphs=vllm, the engine's shipped code)" in listed
    assert "harness.adapters.trtllm:load_capturer  (--impl graphs=trtllm, the engine's shipped code)" in listed
    assert "harness.adapters.bcg:load_capturer  (--impl graphs=bcg, the engine's shipped code)" in listed
    assert "harness.adapters.pcg:load_capturer  (--impl graphs=pcg, the engine's shipped code)" in listed
    assert "sglang" not in sys.modules and "vllm" not in sys.modules and "tensorrt_llm" not in sys.modules
    assert "breakable_cuda_graphs" not in sys.modules and "piecewise_cuda_graphs" not in sys.modules


@needs_sglang_modules
def test_graphs_adapter_imports_the_real_modules_and_refuses_the_emulated_backend():
    result = _python("""
        from harness import impls
        from harness.adapters.sglang import engine_version
        from harness.errors import UsageError
        print("version", engine_version())
        print("loads", impls.load("graphs", "sglang", graph_backend="cuda").obj.__name__)
        try:
            impls.load("graphs", "sglang", graph_backend="emulated")
        except UsageError as error:
            print("refused", error)
    """, path=SGLANG_MODULES)
    assert "version 0.5.23" in result.stdout and "loads SGLangCapturer" in result.stdout, result.stdout + result.stderr
    assert "refused --impl graphs=sglang captures real CUDA graphs" in result.stdout


@needs_sglang_modules
def test_harness_breaks_reach_sglangs_own_marker():
    """Through the seam, a harness break becomes a call of SGLang's eager_on_graph wrapper (outside an
    SGLang capture it is SGLang's plain call), and the receiver records its name for break_names."""
    result = _python("""
        import torch
        from harness.graphs import EngineBreaks, eager_on_graph, receive_breaks  # the adapter's receiver
        from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import eager_on_graph as mark
        wrapped = []
        def spy(fn):
            wrapped.append(fn.__qualname__)
            return mark(fn)
        @eager_on_graph
        def attention(h, *, scale):
            return h * scale
        receiver = EngineBreaks(spy)
        with receive_breaks(receiver):
            out = attention(torch.ones(2), scale=3.0)
        print(wrapped, receiver.names, out.tolist())
    """, path=SGLANG_MODULES)
    assert "['attention'] ['attention'] [3.0, 3.0]" in result.stdout, result.stdout + result.stderr


@needs_sglang_modules
def test_gather_adapter_is_sglangs_kernel_and_matches_eager_on_in_range_indices():
    """SGLang's Triton gather on the CPU through Triton's interpreter (where triton is importable)."""
    result = _python("""
        import torch
        from harness import impls
        from harness.gather import eager_gather
        try:
            gather = impls.load("gather", "sglang").obj
        except Exception as error:
            print("unavailable", error); raise SystemExit
        from sglang.kernels.ops.speculative.gather_spec_extras import gather_spec_extras
        assert gather is gather_spec_extras
        g = torch.Generator().manual_seed(0)
        bufs = (torch.randn(9, 4, generator=g), torch.randint(0, 50, (9, 4), generator=g),
                torch.randint(0, 50, (9,), generator=g), torch.randn(9, 6, generator=g))
        indices = torch.tensor([3, 0, 8, 3])
        print("equal", all(torch.equal(a, b) for a, b in zip(gather(indices, *bufs), eager_gather(indices, *bufs))))
    """, path=SGLANG_MODULES, env={"TRITON_INTERPRET": "1"})
    if "unavailable" in result.stdout:
        pytest.skip(f"SGLang's gather needs triton: {result.stdout.strip()[:200]}")
    assert "equal True" in result.stdout, result.stdout + result.stderr
