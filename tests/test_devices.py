"""One device and backend rule: every entry point (pytest, selfcheck, conformance, bench) answers the same
request the same way, on one table of requests, with and without a GPU in sight."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from harness import cli, conformance, selfcheck
from harness.bench import command as bench_command
from harness.devices import resolve
from harness.errors import UsageError

NO_GPU_CUDA = "sees no CUDA device"
CPU_DEVICE = "needs --device cuda"

# (device, graph backend, torch sees a GPU) -> (device type, backend), or a phrase of the one-line error
TABLE = [
    ("auto", "auto", False, ("cpu", "emulated")),
    ("auto", "auto", True, ("cuda", "cuda")),
    ("cpu", "auto", True, ("cpu", "emulated")),
    ("cpu", "emulated", False, ("cpu", "emulated")),
    ("auto", "emulated", True, ("cuda", "emulated")),
    ("cuda", "emulated", True, ("cuda", "emulated")),
    ("cuda", "auto", True, ("cuda", "cuda")),
    ("cuda", "cuda", True, ("cuda", "cuda")),
    ("auto", "cuda", True, ("cuda", "cuda")),
    ("cuda", "auto", False, NO_GPU_CUDA),
    ("auto", "cuda", False, NO_GPU_CUDA),
    ("cpu", "cuda", False, CPU_DEVICE),
    # the request that pytest once moved to CUDA silently, and the benchmarks refused
    ("cpu", "cuda", True, CPU_DEVICE),
]


class _Resolved(Exception):
    """Raised by a stand-in for the step after resolution, carrying what the entry point resolved."""

    def __init__(self, device_type: str, backend: str) -> None:
        super().__init__(device_type, backend)
        self.answer = (device_type, backend)


def _through_resolver(device: str, backend: str, capsys: pytest.CaptureFixture[str], **_: object):
    try:
        placement = resolve(device=device, graph_backend=backend)
    except UsageError as error:
        return str(error)
    return placement.device_type, placement.graph_backend


# One child process asks pytest about every row (an in-process pytester would import torch's modules anew, and a
# child per row costs a torch import each). Before each run it shows torch the GPU of the row.
_PYTEST_DRIVER = """
import contextlib, io, json, sys
import pytest, torch
answers = []
for device, backend, gpu in json.loads(sys.argv[1]):
    torch.cuda.is_available = lambda gpu=gpu: gpu
    torch.cuda.device_count = lambda gpu=gpu: int(gpu)
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        pytest.main(["--collect-only", "-p", "no:cacheprovider", "--device", device, "--graph-backend", backend,
                     "test_nothing.py"])
    answers.append(output.getvalue())
print("ANSWERS" + json.dumps(answers))
"""


@pytest.fixture(scope="module")
def pytest_answers(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, bool], str]:
    folder = tmp_path_factory.mktemp("pytest-entry")
    (folder / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    rows = [(device, backend, gpu) for device, backend, gpu, _ in TABLE]
    completed = subprocess.run([sys.executable, "-c", _PYTEST_DRIVER, json.dumps(rows)], cwd=folder,
                               capture_output=True, text=True, timeout=300)
    marker = completed.stdout.rfind("ANSWERS")
    assert marker >= 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return dict(zip(rows, json.loads(completed.stdout[marker + len("ANSWERS"):])))


def _through_pytest(device: str, backend: str, capsys: pytest.CaptureFixture[str], *,
                    request: pytest.FixtureRequest, gpu: bool, **_: object):
    output = request.getfixturevalue("pytest_answers")[(device, backend, gpu)]
    header = re.search(r"^harness: device=(\w+), graph backend=(\w+)", output, re.MULTILINE)
    return (header[1], header[2]) if header else output


def _through_selfcheck(device: str, backend: str, capsys: pytest.CaptureFixture[str], *,
                       monkeypatch: pytest.MonkeyPatch, **_: object):
    def stop(*args: object, graph_backend: str, device: str, **kwargs: object):
        raise _Resolved(device, graph_backend)

    monkeypatch.setattr(selfcheck, "run_references", stop)
    monkeypatch.setattr(selfcheck, "run_one", stop)
    try:
        status = cli.main(["selfcheck", "--component", "graphs", "--jobs", "1", "--device", device,
                           "--graph-backend", backend])
    except _Resolved as resolved:
        return resolved.answer
    return f"exit {status}: {capsys.readouterr().err}"


def _through_conformance(device: str, backend: str, capsys: pytest.CaptureFixture[str], *,
                         monkeypatch: pytest.MonkeyPatch, **_: object):
    loaded: list[str] = []

    def load(component: str, spec: str, *, graph_backend: str, **kwargs: object):
        loaded.append(graph_backend)

    def run_child(command: list[str], *args: object, **kwargs: object):
        # the child pytest's command line carries what conformance resolved (each value joined to its option,
        # child_runs.pytest_command); it must match what it loaded
        values = dict(word.split("=", 1) for word in command if word.startswith("--") and "=" in word)
        answer = values["--device"], values["--graph-backend"]
        assert loaded == [answer[1]]
        raise _Resolved(*answer)

    monkeypatch.setattr(conformance.impls, "load", load)
    monkeypatch.setattr(conformance.child_runs, "run", run_child)
    try:
        status = cli.main(["conformance", "--impl", "graphs=reference", "--device", device, "--graph-backend", backend])
    except _Resolved as resolved:
        return resolved.answer
    return f"exit {status}: {capsys.readouterr().err}"


def _through_bench(device: str, backend: str, capsys: pytest.CaptureFixture[str], *,
                   monkeypatch: pytest.MonkeyPatch, **_: object):
    def environment(device_: torch.device, backend_name: str):
        raise _Resolved(device_.type, backend_name)

    monkeypatch.setattr(bench_command, "environment", environment)
    try:
        status = bench_command.main(["gather", "--device", device, "--graph-backend", backend])
    except _Resolved as resolved:
        return resolved.answer
    return f"exit {status}: {capsys.readouterr().err}"


ENTRY_POINTS = {"resolver": _through_resolver, "pytest": _through_pytest, "selfcheck": _through_selfcheck,
                "conformance": _through_conformance, "bench": _through_bench}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize(("device", "backend", "gpu", "expected"), TABLE,
                         ids=[f"{d}-{b}-{'gpu' if g else 'nogpu'}" for d, b, g, _ in TABLE])
def test_every_entry_point_answers_a_request_alike(entry, device, backend, gpu, expected, monkeypatch, capsys,
                                                   request):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1 if gpu else 0)
    answer = ENTRY_POINTS[entry](device, backend, capsys, request=request, monkeypatch=monkeypatch, gpu=gpu)
    if isinstance(expected, tuple):
        assert answer == expected, f"{entry}: --device {device} --graph-backend {backend} -> {answer}"
    else:
        assert isinstance(answer, str) and expected in answer, f"{entry}: expected an error with {expected!r}: {answer}"
        assert "Traceback" not in answer
