"""The kill matrix's fork server: its children's verdicts are the plain processes' verdicts, whatever the
child does (fail, pass, exit, crash, hang, kill the server), and the server never initialises CUDA."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from harness import impls, selfcheck
from harness.selfcheck.fork_server import PRELOAD, ForkServer, ForkServerUnavailable

pytestmark = pytest.mark.skipif(not selfcheck.fork_server_available(), reason="no os.fork on this platform")

# A one-test "gather suite" (run_one runs <root>/suites/gather), so that each run is start-up and little else.
SUITE = '''
import torch

from harness.gather import eager_gather


def test_gather_matches_the_oracle(gather_function):
    generator = torch.Generator().manual_seed(0)
    buffers = (torch.rand(6, 3, generator=generator), torch.arange(18).reshape(6, 3), torch.arange(6), None)
    indices = torch.tensor([4, 0, 2])
    actual = gather_function(indices, *buffers)
    for got, expected in zip(actual, eager_gather(indices, *buffers)):
        assert (got is None and expected is None) or torch.equal(got, expected)
'''
# The implementations under test: each misbehaves on the suite's own case only (not on the start-up smoke call).
IMPLEMENTATIONS = '''
import ctypes
import os
import sys
import time

from harness.gather import eager_gather


def _later(indices):
    return indices.tolist() == [4, 0, 2]


def right(*args):
    return eager_gather(*args)


def wrong(*args):
    topk_p, *rest = eager_gather(*args)
    return (topk_p + 1 if _later(args[0]) else topk_p, *rest)


def exits(*args):
    if _later(args[0]):
        os._exit(7)
    return eager_gather(*args)


def segfaults(*args):
    if _later(args[0]):
        ctypes.string_at(0)
    return eager_gather(*args)


def hangs(*args):
    if _later(args[0]):
        time.sleep(3600)
    return eager_gather(*args)


def kills_the_fork_server(*args):
    # Only a child forked from the fork server (whose main module is the server's) kills its parent; a
    # plain process (the fallback) fails the test instead.
    if getattr(sys.modules["__main__"], "__file__", "").endswith("fork_server.py") and _later(args[0]):
        os.kill(os.getppid(), 9)
        time.sleep(3600)
    return wrong(*args)
'''
HANG_SECONDS = 8.0  # the hanging run's process limit


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fork-server")
    (root / "suites" / "gather").mkdir(parents=True)
    (root / "suites" / "gather" / "test_tiny.py").write_text(SUITE)
    (root / "implementations.py").write_text(IMPLEMENTATIONS)  # importable: the root is the children's cwd
    return root


@pytest.fixture(scope="module")
def environment() -> dict[str, str]:
    return selfcheck.child_environment(threads=1)


@pytest.fixture(scope="module")
def server(root: Path, environment: dict[str, str]):
    with ForkServer(environment=environment, cwd=root) as server:
        yield server


def _mutant(name: str) -> impls.Implementation:
    return impls.Implementation("gather", f"implementations:{name}", None, "mutant", name)


def _run(name: str, root: Path, environment: dict[str, str], server: ForkServer | None) -> selfcheck.Outcome:
    return selfcheck.run_one(_mutant(name), graph_backend="emulated", device="cpu", root=root, test_timeout=None,
                             process_timeout=HANG_SECONDS if name == "hangs" else 600,
                             environment=environment, fork_server=server)


def _assert_passes_in_a_child(server: ForkServer, test_file: str, root: Path, environment: dict[str, str]) -> None:
    """Run the test file ``test_file`` of ``root`` in a pytest forked from ``server``; it must pass."""
    out, err = root / f"{test_file}.out", root / f"{test_file}.err"
    exit_status = server.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
                             environment=environment, cwd=root, time_limit=120, stdout=out, stderr=err)
    assert exit_status == 0, out.read_text()[-3000:] + err.read_text()[-3000:]


def test_the_server_imports_everything_and_never_initialises_cuda(server: ForkServer, environment: dict[str, str]):
    ready = server.wait_ready()
    assert ready["ready"], ready
    # Every preloaded module came in, and none of them asked for CUDA (on a GPU machine a module that did
    # would be named here, with the line that asked); the server's own probe found its forks unpoisoned.
    assert ready["skipped"] == {} and ready["cuda_asked"] == [], ready
    assert ready["cuda_initialized"] is False
    if environment["OMP_NUM_THREADS"] == "1" and ready["os_threads"] is not None:
        # No BLAS or OpenMP pool either, whose threads a child would lack. A thread of the CUDA driver (a
        # library reached it past the guard) is the driver's own business: the probe found forks able to
        # run kernels, which is what matters (ready above; test_a_forked_child_runs_kernels_on_the_gpu).
        assert len([name for name in ready["os_threads"] if not name.startswith("cuda")]) == 1, ready
    assert ready["modules"] > 1000  # torch, transformers, hypothesis, the harness: not a bare interpreter
    assert not any(name.startswith("suites") for name in PRELOAD)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_a_forked_child_runs_kernels_on_the_gpu(root: Path, environment: dict[str, str], server: ForkServer):
    assert server.wait_ready()["gpus"] >= 1
    (root / "test_kernel_in_child.py").write_text(
        "import torch\n\ndef test_kernel():\n    assert torch.arange(4, device='cuda').sum().item() == 6\n")
    _assert_passes_in_a_child(server, "test_kernel_in_child.py", root, environment)


@pytest.mark.parametrize(("name", "verdict"), [("wrong", "killed"), ("right", "survived"), ("exits", "error"),
                                               ("segfaults", "error"), ("hangs", "timed out")])
def test_a_forked_run_gives_the_plain_process_verdict(name: str, verdict: str, root: Path,
                                                      environment: dict[str, str], server: ForkServer):
    forked = _run(name, root, environment, server)
    plain = _run(name, root, environment, None)
    assert (forked.launch, plain.launch) == ("fork server", "process")
    assert forked.verdict == plain.verdict == verdict, (forked, plain)
    if verdict == "killed":
        assert (forked.first_failure == plain.first_failure
                == "suites/gather/test_tiny.py::test_gather_matches_the_oracle")
        assert forked.seconds_to_first_failure is not None
    if verdict == "error":  # then the last line of output follows, which differs: the server's imports warned in it
        status = {"exits": 7, "segfaults": -signal.SIGSEGV}[name]
        assert forked.first_failure.startswith(f"pytest exit {status}: "), forked
        assert plain.first_failure.startswith(f"pytest exit {status}: "), plain
    if verdict == "timed out":
        assert f"process limit of {HANG_SECONDS:g} s" in forked.first_failure
        assert forked.seconds < HANG_SECONDS + 10


def test_the_server_survives_its_children(server: ForkServer, root: Path, environment: dict[str, str]):
    """After a child's crash, the same server forks the next run."""
    outcomes = [_run(name, root, environment, server) for name in ("segfaults", "exits", "wrong")]
    assert [(o.verdict, o.launch) for o in outcomes] == [("error", "fork server")] * 2 + [("killed", "fork server")]
    assert server._process.poll() is None


@pytest.mark.long_running
def test_when_the_server_dies_its_run_and_the_rest_start_as_plain_processes(root: Path,
                                                                           environment: dict[str, str]):
    # A small preload: this server is killed at once, its imports need not be the matrix's.
    with ForkServer(environment=environment, cwd=root, preload=("torch", "pytest", "harness.plugin")) as server:
        outcome = _run("kills_the_fork_server", root, environment, server)
        assert outcome.verdict == "killed", outcome  # the plain process's verdict
        assert outcome.launch.startswith("process (the fork server died (exit -9"), outcome.launch
        later = _run("wrong", root, environment, server)
        assert later.verdict == "killed" and later.launch.startswith("process (the fork server died"), later
    table = selfcheck.format_matrix([outcome, later])
    assert "2 mutant runs started as plain processes, not from the fork server: the fork server died" in table


def test_a_module_asking_for_cuda_at_import_is_left_to_the_children(root: Path, environment: dict[str, str]):
    # It would poison every fork on a GPU machine: the guard refuses the call (the module's own
    # ``except Exception`` cannot swallow the refusal), so the module is not imported and CUDA stays untouched.
    (root / "asks_for_cuda.py").write_text(
        "import torch\n\ntry:\n    DEVICE = torch.cuda.current_device()\nexcept Exception:\n    DEVICE = None\n")
    with ForkServer(environment=environment, cwd=root, preload=("torch", "asks_for_cuda")) as server:
        ready = server.wait_ready()
    assert ready["ready"] and ready["cuda_initialized"] is False, ready
    assert list(ready["skipped"]) == ["asks_for_cuda"], ready
    assert "asks for CUDA at import" in ready["skipped"]["asks_for_cuda"]
    assert ready["cuda_asked"] and ready["cuda_asked"][0].startswith("torch.cuda.current_device() from ")
    assert "asks_for_cuda.py:4" in ready["cuda_asked"][0]


def test_a_module_asking_whether_there_is_a_gpu_is_preloaded(root: Path, environment: dict[str, str]):
    # Inductor and cpp_extension ask at import time; the server answers from NVML, which leaves forks usable
    # (on a GPU machine the probe before "ready" would find them poisoned otherwise), and puts the variable
    # that says so back before it serves: a child sees the request's environment, and the preloaded module.
    (root / "asks_whether.py").write_text(
        "import os, torch\n\nHAS_GPU = torch.cuda.is_available() and torch.cuda.device_count() > 0\n"
        "CHECK = os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK')\n")
    (root / "test_child_environment.py").write_text(
        "import os, sys\n\ndef test_environment():\n"
        "    assert 'asks_whether' in sys.modules and sys.modules['asks_whether'].CHECK == '1'\n"
        f"    assert os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK') == "
        f"{environment.get('PYTORCH_NVML_BASED_CUDA_CHECK')!r}\n")
    with ForkServer(environment=environment, cwd=root, preload=("torch", "asks_whether")) as server:
        ready = server.wait_ready()
        assert ready["ready"] and ready["cuda_initialized"] is False, ready
        assert ready["skipped"] == {} and ready["cuda_asked"] == [], ready
        _assert_passes_in_a_child(server, "test_child_environment.py", root, environment)


def test_each_child_seeds_its_generators_afresh_as_a_plain_process_does(root: Path, environment: dict[str, str]):
    # A plain process seeds Python's, NumPy's and torch's global generators from the OS; forked children
    # would share the server's states (two children drawing the same numbers), whatever its imports drew.
    (root / "draws_at_import.py").write_text(
        "import random, numpy, torch\n\nDRAWN = (random.random(), numpy.random.rand(), torch.rand(1).item())\n")
    (root / "test_fresh_state.py").write_text(
        "import json, os, random, numpy, torch\n\ndef test_state():\n"
        "    with open(f'drawn-{os.getpid()}.json', 'w') as handle:\n"
        "        json.dump([random.random(), numpy.random.rand(), torch.rand(1).item()], handle)\n")
    with ForkServer(environment=environment, cwd=root, preload=("torch", "numpy", "draws_at_import")) as server:
        assert server.wait_ready()["skipped"] == {}
        for _ in range(2):
            _assert_passes_in_a_child(server, "test_fresh_state.py", root, environment)
    first, second = (json.loads(path.read_text()) for path in sorted(root.glob("drawn-*.json")))
    assert all(a != b for a, b in zip(first, second)), (first, second)


def test_a_request_the_server_cannot_serve_runs_as_a_plain_process(root: Path, environment: dict[str, str],
                                                                   server: ForkServer):
    other = {**environment, "OMP_NUM_THREADS": "3"}  # read at import time by the server's libraries
    with pytest.raises(ForkServerUnavailable, match="other values of OMP_NUM_THREADS"):
        server.run([sys.executable, "-m", "pytest"], environment=other, cwd=root, time_limit=None,
                   stdout=root / "out", stderr=root / "err")
    outcome = _run("wrong", root, other, server)
    assert outcome.verdict == "killed" and outcome.launch.startswith("process (the fork server was started with")


def test_the_fork_server_can_be_switched_off(monkeypatch: pytest.MonkeyPatch):
    assert selfcheck.fork_server_wanted(True)
    assert not selfcheck.fork_server_wanted(False)
    monkeypatch.setenv("HARNESS_FORK_SERVER", "0")
    assert not selfcheck.fork_server_wanted(True)
    monkeypatch.delenv("HARNESS_FORK_SERVER")
    monkeypatch.delattr(os, "fork")  # a platform without it (Windows) starts plain processes
    assert not selfcheck.fork_server_wanted(True)


def test_selfcheck_passes_no_server_when_switched_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    servers = []

    def fake_run_one(impl, **options: object) -> selfcheck.Outcome:
        servers.append(options["fork_server"])
        verdict = "passed" if impl.kind == "reference" else "killed"
        return selfcheck.Outcome(impl.component, impl.name, impl.kind, verdict, "", 1.0, "", "", 0.5, "emulated")

    monkeypatch.setattr(selfcheck, "run_one", fake_run_one)
    # References in the mutants' slots, as on a small machine: every run goes through run_one.
    monkeypatch.setattr(selfcheck, "reference_workers", lambda: 1)
    started = time.monotonic()
    selfcheck.run_selfcheck(components=["graphs"], graph_backend="emulated", device="cpu", jobs=1, root=tmp_path,
                            fork_server=False)
    assert servers and not any(servers)
    assert time.monotonic() - started < 30


def test_plugins_a_run_blocks_are_not_preloaded(monkeypatch: pytest.MonkeyPatch):
    from harness.selfcheck.fork_server import _plugin_modules

    assert "xdist.plugin" in _plugin_modules() and "_pytest.python" in _plugin_modules()
    monkeypatch.setenv("PYTEST_ADDOPTS", "-q -p no:xdist -pno:timeout")
    modules = _plugin_modules()
    assert "xdist.plugin" not in modules and "pytest_timeout" not in modules and "_pytest.python" in modules
