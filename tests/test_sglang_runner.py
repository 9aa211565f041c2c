"""``--impl runner=sglang``: SGLang 0.5.23's PrefillCudaGraphRunner, its control path extracted unchanged by
``.ci/gpu/extract-sglang``, on the stand-ins of ``.ci/gpu/sglang-standins``.

What runs on the CPU: the extraction (the runner's modules are the wheel's bytes, every stand-in is copied and
listed in STANDINS.md and says what it stands in for), the adapter's one-line refusals (no SGLang, no stand-ins,
a backend other than CUDA) and the stand-in ForwardBatch's two faces. The runner itself needs a GPU
(``.ci/gpu/sglang-runner-smoke``, the conformance report of ``.ci/gpu/engine-conformance``). Against the release
wheel (``HARNESS_SGLANG_WHEEL`` or ``/tmp/sglang-wheel``; skipped, saying so, without it)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from engine_releases import extraction_script, needs_release_wheel, release_wheel

from harness import impls
from harness.adapters.sglang import SGLANG_VERSION
from harness.errors import ImplementationError

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "gpu" / "extract-sglang"
STANDINS = ROOT / ".ci" / "gpu" / "sglang-standins"
WHEEL = release_wheel("sglang", SGLANG_VERSION)
needs_wheel = needs_release_wheel(WHEEL, engine="sglang", name="SGLang", version=SGLANG_VERSION)


def _python(code: str, folder: Path) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with ``folder`` first on its path (the stand-in sglang must not leak)."""
    environment = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
                       PYTHONPATH=os.pathsep.join([str(folder), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def extracted(tmp_path_factory) -> Path:
    if WHEEL is None:
        pytest.skip("no SGLang wheel (see needs_wheel)")
    folder = tmp_path_factory.mktemp("extract") / ".sglang"
    completed = subprocess.run([sys.executable, str(SCRIPT), str(WHEEL), str(folder)], capture_output=True,
                               text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return folder


@needs_wheel
def test_the_runners_modules_are_the_wheels_bytes_and_every_stand_in_is_listed(extracted):
    script = extraction_script(SCRIPT)
    listing = (extracted / "STANDINS.md").read_text()
    with zipfile.ZipFile(WHEEL) as archive:
        for name in script.RUNNER_EXTRACTED:
            assert (extracted / name).read_bytes() == archive.read(name), f"{name} differs from the wheel's"
            assert f"- `{name}`" in listing
    standins = sorted(str(path.relative_to(STANDINS)) for path in STANDINS.rglob("*.py"))
    assert "sglang_runner_standins.py" in standins and "sglang/srt/runtime_context.py" in standins
    for name in standins:
        assert name not in script.RUNNER_EXTRACTED, f"{name} is both extracted and stood in for"
        assert (extracted / name).read_bytes() == (STANDINS / name).read_bytes()
        docstring = ast.get_docstring(ast.parse((STANDINS / name).read_text())) or ""
        assert docstring.startswith(("Stand-in (harness .ci/gpu/extract-sglang)", "Stand-ins (harness",
                                     "Helpers of the harness's stand-ins")), f"{name} does not say what it is"
        assert f"- `{name}`: " in listing, f"STANDINS.md does not list {name}"


@needs_wheel
def test_the_runner_adapter_loads_sglangs_runner_and_refuses_the_cpu_in_one_line(extracted):
    result = _python("""
        from harness import impls
        from harness.adapters.sglang import SGLangRunner
        from harness.errors import UsageError
        from harness.graphs import GraphCapturer, get_backend
        from harness.models import build_model
        loaded = impls.load("runner", "sglang", graph_backend="cuda").obj
        import sglang_runner_standins
        print("loads", loaded.__name__, sglang_runner_standins.PrefillCudaGraphRunner.__mro__[1].__module__)
        for refuse in (lambda: impls.load("runner", "sglang", graph_backend="emulated"),
                       lambda: SGLangRunner(build_model("dense"), buckets=(4,),
                                            graphs=GraphCapturer(get_backend("emulated")))):
            try:
                refuse()
            except UsageError as error:
                print("refused", len(str(error).splitlines()), error)
    """, extracted)
    out = result.stdout
    assert "loads SGLangRunner sglang.srt.model_executor.runner.prefill_cuda_graph_runner" in out, out + result.stderr
    assert out.count("refused 1 --impl runner=sglang runs SGLang's PrefillCudaGraphRunner") == 2, out
    assert "--device cuda --graph-backend cuda" in out


@needs_wheel
def test_the_tensor_parallel_cases_skip_saying_why_where_their_cpu_ranks_cannot_run_the_adapter(extracted):
    """One GPU: the tensor-parallel suite's ranks are gloo CPU processes on the emulated backend, which SGLang's
    runner refuses, so the suite skips with that refusal instead of failing every case on every rank."""
    result = _python("""
        from harness.plugin.tensor_parallel import _refuses_the_emulated_backend
        print("adapter:", _refuses_the_emulated_backend({"runner": "sglang"}))
        print("reference:", repr(_refuses_the_emulated_backend({"runner": "reference", "graphs": "reference"})))
    """, extracted)
    out = result.stdout
    assert "adapter: --impl runner=sglang runs SGLang's PrefillCudaGraphRunner" in out, out + result.stderr
    assert "reference: ''" in out, out


@needs_wheel
def test_the_model_runner_stand_in_reads_a_multimodal_models_text_settings(extracted):
    """A multimodal model's config (the transformers Llava's LlavaConfig) keeps the hidden size and vocabulary in its
    text config."""
    result = _python("""
        from sglang_runner_standins import ModelRunner
        from harness.models import build_model
        from harness.models.transformers_zoo import build_architecture
        for name, model in (("dense", build_model("dense")), ("vlm", build_model("vlm")),
                            ("llava", build_architecture("llava"))):
            text = getattr(model.config, "text_config", model.config)
            settings = ModelRunner(model).model_config
            print(name, settings.hidden_size == text.hidden_size, settings.vocab_size == text.vocab_size,
                  settings.is_multimodal)
    """, extracted)
    assert result.stdout.split("\n")[:3] == ["dense True True False", "vlm True True True", "llava True True True"], (
        result.stdout + result.stderr)


@needs_wheel
def test_every_runner_the_adapter_builds_stands_for_a_server_launch_with_its_own_graph_pool(extracted):
    """SGLang keeps one graph memory pool per launched server; a runner built after an earlier one was freed must not
    capture into the freed graphs' pool (PyTorch's allocator asserts), so each build is a launch with a fresh pool."""
    result = _python("""
        from sglang.srt.runtime_context import configure_prefill_buckets, get_exec, get_resources
        get_resources().graph_memory_pool = ("an earlier server's pool",)
        configure_prefill_buckets((8, 4))
        print(get_resources().graph_memory_pool, get_exec().graph.cuda_graph_config.prefill.bs)
    """, extracted)
    assert result.stdout.strip() == "None [8, 4]", result.stdout + result.stderr


@needs_wheel
def test_the_runner_adapter_without_its_stand_ins_names_the_extract_command(extracted, tmp_path):
    folder = tmp_path / "partial"
    shutil.copytree(extracted, folder)
    (folder / "sglang_runner_standins.py").unlink()
    result = _python("""
        from harness import impls
        try:
            impls.load("runner", "sglang", graph_backend="cuda")
        except Exception as error:
            print(type(error).__name__, error)
    """, folder)
    assert result.stdout.startswith("ImplementationError --impl runner=sglang needs the data-path stand-ins"), (
        result.stdout + result.stderr)
    assert ".ci/gpu/extract-sglang WHEEL DIR" in result.stdout and result.stdout.count("\n") == 1


@needs_wheel
def test_the_stand_in_batch_is_the_harness_batch_with_sglangs_names(extracted):
    """Built with SGLang's keywords (capture_prepare's dummy batch) it is a harness batch of those requests; made
    from a harness batch it reads as SGLang's runner expects, and the harness batch is not changed."""
    result = _python("""
        import torch
        from harness.batch import ForwardBatch as HarnessBatch
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
        ids = torch.arange(8)
        dummy = ForwardBatch(forward_mode=ForwardMode.EXTEND, batch_size=1, input_ids=ids, positions=ids * 0,
                             seq_lens=torch.tensor([8]), extend_seq_lens_cpu=[8], lora_ids=None,
                             capture_hidden_mode=CaptureHiddenMode.FULL, spec_info=None)
        print("dummy", isinstance(dummy, HarnessBatch), dummy.seq_lens, dummy.hidden_mode.value, dummy.batch_size)
        live = HarnessBatch.from_lengths([2, 3], vocab_size=10, hidden_mode="last")
        seen = ForwardBatch.from_harness(live)
        seen.dp_local_start_pos = None  # what _run_forward writes on its batch
        print("live", seen.batch_size, seen.extend_seq_lens_cpu, seen.capture_hidden_mode.name,
              seen.forward_mode.is_target_verify(), seen.input_embeds, "dp_local_start_pos" in vars(live))
    """, extracted)
    assert "dummy True (8,) full 1" in result.stdout, result.stdout + result.stderr
    assert "live 2 [2, 3] LAST False None False" in result.stdout, result.stdout + result.stderr


def test_the_runner_adapter_is_listed_without_importing_sglang():
    assert "sglang" in impls._row("runner").adapters
    assert "sglang" not in sys.modules


@pytest.mark.skipif(__import__("importlib.util").util.find_spec("sglang") is not None,
                    reason="SGLang is importable in this environment")
def test_selecting_the_runner_adapter_without_the_engine_says_what_to_install():
    with pytest.raises(ImplementationError) as raised:
        impls.load("runner", "sglang", graph_backend="cuda")
    message = str(raised.value)
    assert "\n" not in message and "--impl runner=sglang needs SGLang" in message
    assert "pip install sglang==0.5.23" in message


def _runtime_reads(folder: Path) -> dict[str, str]:
    """Every attribute chain SGLang's extracted modules read from a runtime_context getter (``get_exec().graph.x``,
    or a name bound to ``get_resources()`` then ``.x``) that the folder's stand-in lacks: chain -> where read."""
    sys.path.insert(0, str(folder))
    try:
        context = __import__("sglang.srt.runtime_context", fromlist=["get_exec"])
    finally:
        sys.path.remove(str(folder))
        for name in [name for name in sys.modules if name == "sglang" or name.startswith("sglang.")]:
            del sys.modules[name]  # the stand-in package must not stay importable for later tests
    getters = {name for name in dir(context) if name.startswith("get_") and name != "get_stream"}
    missing: dict[str, str] = {}
    for path in sorted((folder / "sglang").rglob("*.py")):
        if path.name == "runtime_context.py":
            continue
        tree = ast.parse(path.read_text())
        for scope in ast.walk(tree):
            if not isinstance(scope, (ast.Module, ast.FunctionDef)):
                continue
            bound = {node.targets[0].id: node.value.func.id for node in ast.walk(scope)
                     if isinstance(node, ast.Assign) and len(node.targets) == 1
                     and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call)
                     and isinstance(node.value.func, ast.Name)
                     and node.value.func.id in getters}
            for node in ast.walk(scope):
                if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
                    continue
                chain, root = [], node
                while isinstance(root, ast.Attribute):
                    chain.insert(0, root.attr)
                    root = root.value
                if isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and root.func.id in getters:
                    getter = root.func.id
                elif isinstance(root, ast.Name) and root.id in bound:
                    getter = bound[root.id]
                else:
                    continue
                value = getattr(context, getter)()
                for depth, attribute in enumerate(chain, 1):
                    if not hasattr(value, attribute):
                        missing[f"{getter}().{'.'.join(chain[:depth])}"] = f"{path.relative_to(folder)}:{node.lineno}"
                        break
                    value = getattr(value, attribute)
    return missing


@needs_wheel
def test_the_runtime_context_stand_in_answers_everything_sglangs_runner_reads(extracted):
    """The stand-in for SGLang's runtime context answers, with the release's defaults, every setting the extracted
    runner modules read from it (a missing one surfaced on the H200 as an AttributeError inside SGLang's capture)."""
    assert _runtime_reads(extracted) == {}
