"""SGLang 0.5.23's discovery rule (``harness.adapters.sglang.sglang_0_5_23_rule``) and where its code comes from.

``.ci/gpu/extract-sglang`` cuts ``resolve_language_model`` and ``_resolve_transformer_layer_model`` from the
release wheel's files, verbatim, into the folder's ``sglang_discovery.py``; the rule imports that module and maps
SGLang's answer (a module, or its ``RuntimeError``) into the harness's discovery result or a refusal. What runs
everywhere: the cut on a small wheel written here (whose functions are this file's own, not SGLang's), the
rule's mapping on it, its one-line refusals. Against the release wheel (``HARNESS_SGLANG_WHEEL``, or
``/tmp/sglang-wheel``; skipped, saying so, without it): the cut compared with the wheel's own file text, and the
rule on two tiny models, one SGLang resolves and one it refuses.
"""

from __future__ import annotations

import ast
import hashlib
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest
from engine_releases import extraction_script, needs_release_wheel, release_wheel
from torch import nn

from harness.adapters.sglang import SGLANG_VERSION, sglang_0_5_23_rule
from harness.errors import ImplementationError
from harness.runner import DiscoveryRefused, DiscoveryWarning, discover_layer_model, harness_rule

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "gpu" / "extract-sglang"


WHEEL = release_wheel("sglang", SGLANG_VERSION)
needs_wheel = needs_release_wheel(WHEEL, engine="sglang", name="SGLang", version=SGLANG_VERSION)


def _script() -> types.ModuleType:
    return extraction_script(SCRIPT)


def _extract(wheel: Path, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(wheel), str(folder)], capture_output=True, text=True,
                          timeout=300)


def _functions(text: str) -> dict[str, str]:
    """``{name: source text}`` of the module-level functions of ``text``."""
    return {node.name: ast.get_source_segment(text, node) for node in ast.parse(text).body
            if isinstance(node, ast.FunctionDef)}


@pytest.fixture
def use_folder(monkeypatch):
    """``use_folder(path)``: ``path`` first on sys.path for this test; its sglang_discovery is forgotten after."""
    sys.modules.pop("sglang_discovery", None)
    yield lambda folder: monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop("sglang_discovery", None)


# Two tiny models: a causal LM whose stack is at .model (SGLang resolves it), and a GPT-style one whose stack is
# at .transformer.h (SGLang 0.5.23 refuses it: no .layers behind .model).
class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])


class CausalLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = Stack()
        self.lm_head = nn.Linear(4, 8)


class GPTStyle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.h = nn.ModuleList([nn.Linear(4, 4)])
        self.lm_head = nn.Linear(4, 8)


# --- the cut, on a small wheel written here ------------------------------------------------------------

# Stand-ins of the two files, with this file's own functions under SGLang's names (formatting and comments kept
# odd on purpose: the cut must keep them).
_UTILS = '''\
# leading comment: a licence line
import torch
from torch import nn


def other():  # not cut
    return 1


def resolve_language_model(model: nn.Module) -> nn.Module:
    # the inner module, or the model itself
    return getattr(model,   "model", model)
'''
_RUNNER = '''\
# another leading comment
from __future__ import annotations

import torch

from sglang.srt.model_loader.utils import resolve_language_model


def _resolve_transformer_layer_model(model: torch.nn.Module) -> torch.nn.Module:
    inner = resolve_language_model(model)
    if not hasattr(inner, "layers"):
        raise RuntimeError(f"no layers on {type(model).__name__}")  # words of this test
    return inner
'''


def _small_wheel(tmp_path: Path, *, utils: str = _UTILS, runner: str = _RUNNER,
                 version: str = SGLANG_VERSION) -> Path:
    script = _script()
    wheel = tmp_path / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        cut_from = {path for path, _ in script.DISCOVERY_FUNCTIONS}
        for name in (*script.EXTRACTED, *script.RUNNER_EXTRACTED):
            if name not in cut_from:
                archive.writestr(name, "")
        archive.writestr(script.DISCOVERY_FUNCTIONS[0][0], utils)
        archive.writestr(script.DISCOVERY_FUNCTIONS[1][0], runner)
    return wheel


def test_the_cut_is_the_functions_text_verbatim_with_its_origin(tmp_path):
    wheel = _small_wheel(tmp_path)
    folder = tmp_path / ".sglang"
    completed = _extract(wheel, folder)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "2 functions cut verbatim into sglang_discovery.py" in completed.stdout
    text = (folder / "sglang_discovery.py").read_text()
    cut = _functions(text)
    assert set(cut) == {"resolve_language_model", "_resolve_transformer_layer_model"}
    assert cut["resolve_language_model"] == _functions(_UTILS)["resolve_language_model"]
    assert cut["_resolve_transformer_layer_model"] == _functions(_RUNNER)["_resolve_transformer_layer_model"]
    # the header names the wheel, its digest, each function's file and lines, and what is bound around them
    header = ast.get_docstring(ast.parse(text))
    assert wheel.name in header and hashlib.sha256(wheel.read_bytes()).hexdigest() in header
    assert "resolve_language_model: sglang/srt/model_loader/utils.py, lines 10-12" in header
    assert ("_resolve_transformer_layer_model: sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py, "
            "lines 9-13") in header
    assert "``import torch``, ``from torch import nn``" in header
    assert "# leading comment: a licence line" in text and "# another leading comment" in text
    listing = (folder / "STANDINS.md").read_text()
    assert "Cut verbatim from the wheel's files" in listing
    assert "- `sglang_discovery.py`: `_resolve_transformer_layer_model` from " in listing


def test_the_cut_refuses_a_function_that_needs_a_name_it_would_not_bind(tmp_path):
    runner = _RUNNER.replace("    return inner\n", "    return wrap(inner)\n").replace(
        "import torch\n\n", "import torch\n\nfrom sglang.srt.layers import wrap\n", 1)
    completed = _extract(_small_wheel(tmp_path, runner=runner), tmp_path / "out")
    assert completed.returncode == 1 and not (tmp_path / "out").exists()
    assert "_resolve_transformer_layer_model uses 'wrap' (from sglang.srt.layers import wrap), which the " \
           "generated module does not bind" in completed.stderr


def test_the_cut_refuses_a_binding_other_than_its_files(tmp_path):
    utils = _UTILS.replace("from torch import nn\n", "from torch import fx as nn\n")
    completed = _extract(_small_wheel(tmp_path, utils=utils), tmp_path / "out")
    assert completed.returncode == 1
    assert "resolve_language_model uses 'nn', which its file binds as 'from torch import fx as nn'" in completed.stderr


# --- the rule ---------------------------------------------------------------------------------------------


def test_the_rule_maps_a_resolved_module_and_a_refusal(tmp_path, use_folder):
    folder = tmp_path / ".sglang"
    assert _extract(_small_wheel(tmp_path), folder).returncode == 0
    use_folder(folder)
    model = CausalLM()
    found = sglang_0_5_23_rule(model)
    assert found.module is model.model and (found.path, found.fell_back, found.searched) == ("model", False, False)
    assert found.rule == "sglang_0_5_23"
    with pytest.raises(DiscoveryRefused) as refused:
        sglang_0_5_23_rule(GPTStyle())
    assert refused.value.reason == "no layers on GPTStyle" and isinstance(refused.value.__cause__, RuntimeError)
    assert refused.value.summary() == {"refused": "no layers on GPTStyle", "rule": "sglang_0_5_23"}


def test_discovery_takes_the_next_rule_after_a_refusal_and_raises_when_all_refuse(tmp_path, use_folder):
    folder = tmp_path / ".sglang"
    assert _extract(_small_wheel(tmp_path), folder).returncode == 0
    use_folder(folder)
    model = GPTStyle()
    with pytest.warns(DiscoveryWarning, match="a search of the module tree chose model.transformer"):
        assert discover_layer_model(model, rules=[sglang_0_5_23_rule, harness_rule]).module is model.transformer
    with pytest.raises(DiscoveryRefused, match="discovery rule 'sglang_0_5_23' refuses GPTStyle: no layers"):
        discover_layer_model(model, rules=[sglang_0_5_23_rule])
    with pytest.raises(DiscoveryRefused):  # strict or not: a refusal names no module to fall back to
        discover_layer_model(model, rules=[sglang_0_5_23_rule], strict=True)


def test_the_rule_without_the_module_names_the_extract_command(tmp_path, monkeypatch, use_folder):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SGLANG_MODULES", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p or ".") / "sglang_discovery.py").is_file()])
    with pytest.raises(ImplementationError) as raised:
        sglang_0_5_23_rule(CausalLM())
    message = str(raised.value)
    assert "\n" not in message and "there is no folder .sglang" in message
    assert ".ci/gpu/extract-sglang WHEEL .sglang writes it from the release wheel" in message
    assert f"pip download sglang=={SGLANG_VERSION} --no-deps" in message
    (tmp_path / ".sglang" / "sglang").mkdir(parents=True)  # a folder an older extract-sglang made
    with pytest.raises(ImplementationError, match=r"the folder \.sglang lacks it \(an older"):
        sglang_0_5_23_rule(CausalLM())
    (tmp_path / ".sglang" / "sglang_discovery.py").write_text("")
    with pytest.raises(ImplementationError, match=r"the folder \.sglang holds it but is not on PYTHONPATH"):
        sglang_0_5_23_rule(CausalLM())


def test_the_rule_refuses_a_cut_of_another_release(tmp_path, use_folder):
    folder = tmp_path / ".sglang"
    assert _extract(_small_wheel(tmp_path, version="0.5.22"), folder).returncode == 0
    use_folder(folder)
    with pytest.raises(ImplementationError, match=f"was cut from sglang 0.5.22, not {SGLANG_VERSION}"):
        sglang_0_5_23_rule(CausalLM())


# --- against the release wheel ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def extracted(tmp_path_factory) -> Path:
    if WHEEL is None:
        pytest.skip("no SGLang wheel (see needs_wheel)")
    folder = tmp_path_factory.mktemp("extract") / ".sglang"
    completed = _extract(WHEEL, folder)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return folder


@needs_wheel
def test_the_cut_is_the_wheels_own_text(extracted):
    script = _script()
    text = (extracted / "sglang_discovery.py").read_text()
    cut = _functions(text)
    sources = ast.literal_eval(next(node.value for node in ast.parse(text).body if isinstance(node, ast.Assign)
                                    and getattr(node.targets[0], "id", None) == "SOURCES"))
    with zipfile.ZipFile(WHEEL) as archive:
        for path, name in script.DISCOVERY_FUNCTIONS:
            original = archive.read(path).decode()
            _, first, last = sources[name]
            assert sources[name][0] == path
            lines = original.splitlines()[first - 1:last]
            assert cut[name] == "\n".join(lines), f"{name} is not {path}'s lines {first}-{last}"
            assert cut[name] == _functions(original)[name]
        for name in script.EXTRACTED:  # the modules beside it stay the wheel's own bytes
            assert (extracted / name).read_bytes() == archive.read(name), f"{name} differs from the wheel's"
    assert cut["_resolve_transformer_layer_model"].count("resolve_language_model(model)") == 1
    header = ast.get_docstring(ast.parse(text))
    assert hashlib.sha256(WHEEL.read_bytes()).hexdigest() in header and WHEEL.name in header
    assert "- `sglang_discovery.py`: `resolve_language_model` from `sglang/srt/model_loader/utils.py`" in (
        extracted / "STANDINS.md").read_text()


@needs_wheel
def test_sglangs_rule_resolves_a_causal_lm_and_refuses_a_gpt_style_model(extracted, use_folder):
    use_folder(extracted)
    model = CausalLM()
    found = sglang_0_5_23_rule(model)
    assert found.module is model.model and (found.path, found.fell_back) == ("model", False)
    with pytest.raises(DiscoveryRefused) as refused:
        sglang_0_5_23_rule(GPTStyle())
    assert refused.value.reason == ("could not resolve inner layer_model on GPTStyle; resolved to GPTStyle "
                                    "without layers.")
