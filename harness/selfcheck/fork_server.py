"""A warm fork server for the kill matrix's mutant runs (its one user is :mod:`harness.selfcheck`).

:class:`ForkServer` starts this file as a script; :func:`serve` documents the protocol and why the
server never initialises CUDA. At module level this file imports the standard library only."""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.plugin.child_runs import lower_priority

__all__ = ["ForkServer", "ForkServerUnavailable", "PRELOAD", "PER_RUN_VARIABLES", "available"]

# What every child of the kill matrix imports before its first test, library code only (never a suite's test
# module or conftest: pytest must import those itself). The pytest plugins of installed packages (entry
# points) are added at start-up. A module missing here costs each child its import; a module that cannot
# be imported, or asks for CUDA at import time, is skipped and named in the ready message.
PRELOAD: tuple[str, ...] = (
    "torch", "torch.multiprocessing", "torch.distributed", "torch.export", "torch._dynamo",
    "torch._dynamo.testing", "functorch.compile", "torch._inductor.compile_fx", "torch._inductor.codecache",
    "torch._inductor.cpp_builder", "torch.utils.cpp_extension", "sympy.combinatorics",
    "transformers", "numpy", "hypothesis", "hypothesis.stateful", "pytest", "syrupy",
    "harness", "harness.plugin", "harness.selfcheck.plugin", "harness.plugin.timeouts", "harness.golden",
    "harness.plugin.report", "harness.distributed.rank_pool",
    # every module of these packages: the components, their cases and strategies, the zoo, the mutants
    "harness.graphs.*", "harness.runner.*", "harness.gather.*", "harness.models.*", "harness.mutants.*",
)
# The variables that differ between the runs of one matrix; every other variable of a request must be the
# server's own (the libraries it imported read theirs at import time: OMP_NUM_THREADS, TORCHINDUCTOR_*).
PER_RUN_VARIABLES = ("HARNESS_RUN_FIRST", "HARNESS_EXIT_ON_FIRST_FAILURE")
# Each preloaded module was imported by the server, not by the child's pytest, so pytest cannot rewrite its
# asserts and says so once per plugin module; the tests' own modules are still rewritten in the child.
_CHILD_OPTIONS = ("-W", "ignore::pytest.PytestAssertRewriteWarning")
# The torch.cuda functions (and torch._C entry points) that reach the CUDA driver; the rest go through them.
# is_available and device_count are not among them: under _NVML_CHECK they count devices through NVML and
# reach the driver only by _cuda_getDeviceCount, where NVML fails.
_CUDA_CALLS = ("torch.cuda.init", "torch.cuda._lazy_init", "torch.cuda.current_device",
               "torch._C._cuda_getDeviceCount", "torch._C._cuda_init")
_NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
_CHILD_FAILED = 70  # the child's own set-up failed before pytest ran (EX_SOFTWARE)
_POLL_SECONDS = 0.02


def available() -> bool:
    """Whether this platform can fork a warm process at all (POSIX)."""
    return hasattr(os, "fork") and hasattr(os, "setsid") and hasattr(os, "killpg")


class ForkServerUnavailable(RuntimeError):
    """The server cannot run this request (it refused to start, died, or does not serve this environment);
    the message says why, for the matrix's note. The caller runs a plain process instead."""


# --- the server (runs in its own process) -------------------------------------------------------------

class _CudaAsked(BaseException):
    # A BaseException, so that an import's ``except Exception`` cannot turn the refusal into a cached "no GPU".
    pass


class _CudaGuard:
    """Between :meth:`install` and :meth:`remove`, the calls of :data:`_CUDA_CALLS` raise and are recorded;
    then the originals are back in place (a wrapper a module kept a reference to passes calls through)."""

    def __init__(self) -> None:
        self.installed = self.active = False
        self.asked: list[str] = []
        self._originals: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        import torch

        for dotted in _CUDA_CALLS:
            owner_name, name = dotted.rsplit(".", 1)
            owner = {"torch.cuda": torch.cuda, "torch._C": torch._C}[owner_name]
            original = getattr(owner, name, None)
            if original is not None:
                self._originals.append((owner, name, original))
                setattr(owner, name, self._wrap(dotted, original))
        self.installed = self.active = True

    def remove(self) -> None:
        self.active = False
        for owner, name, original in self._originals:
            setattr(owner, name, original)

    def _wrap(self, dotted: str, original: Any) -> Any:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.active:
                self.asked.append(f"{dotted}() from {_caller()}")
                raise _CudaAsked(dotted)
            return original(*args, **kwargs)

        guarded.__wrapped__ = original  # type: ignore[attr-defined]
        return guarded


def _caller() -> str:
    frames = [f for f in traceback.extract_stack()[:-2] if "importlib" not in f.filename]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def _submodules(package: str) -> list[str]:
    """Every module of ``package`` (imported: its ``__path__`` is needed), in name order."""
    import pkgutil

    module = importlib.import_module(package)
    return sorted(info.name for info in pkgutil.walk_packages(getattr(module, "__path__", []), package + ".")
                  if not info.name.rsplit(".", 1)[-1].startswith("__"))


def _plugin_modules() -> list[str]:
    """The modules of the pytest plugins that pytest loads in each child: its own, and the installed
    packages' (entry points) unless autoloading is off or PYTEST_ADDOPTS blocks them (``-p no:NAME``)."""
    import _pytest.config

    modules = [f"_pytest.{name}" for name in _pytest.config.default_plugins]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return modules
    import shlex
    from importlib.metadata import entry_points

    words = shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    plugins = [after for word, after in zip(words, words[1:]) if word == "-p"]
    plugins += [word[2:] for word in words if word.startswith("-p") and len(word) > 2]  # -pno:NAME
    blocked = {plugin.removeprefix("no:") for plugin in plugins if plugin.startswith("no:")}
    return modules + [entry.module for entry in entry_points(group="pytest11") if entry.name not in blocked]


def _skip_reason(error: BaseException, guard: _CudaGuard) -> str:
    """Why a module was not preloaded, for the ready message."""
    if isinstance(error, _CudaAsked):
        return f"asks for CUDA at import ({guard.asked[-1] if guard.asked else error})"
    return f"{type(error).__name__}: {str(error)[:200]}"


def _preload(names: Sequence[str], guard: _CudaGuard) -> dict[str, str]:
    """Import ``names`` (``package.*``: the package and every module in it; ``pytest`` brings its plugins),
    the guard installed right after torch; return the skipped ones with the reason."""
    skipped: dict[str, str] = {}
    pending = list(names)
    while pending:
        name = pending.pop(0)
        if name.endswith(".*"):
            name = name[:-2]
            try:
                pending[0:0] = _submodules(name)
            except (_CudaAsked, Exception, SystemExit) as error:
                skipped[name] = _skip_reason(error, guard)
            continue
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except (_CudaAsked, Exception, SystemExit) as error:  # the child imports it itself, as it would anyway
            skipped[name] = _skip_reason(error, guard)
        if not guard.installed and "torch" in sys.modules:
            guard.install()
        if name == "pytest" and "pytest" in sys.modules:
            pending[0:0] = _plugin_modules()
    return skipped


def _fork_defect(gpus: int | None) -> str:
    """Why a child forked now could not use CUDA as a fresh process does ("" when it can): torch marks the
    forks of a process that initialised CUDA, and a process that reached the driver some other way leaves
    forks whose CUDA calls fail, so on a GPU machine (``gpus`` as NVML counted them; None: not known) the
    probe child also runs a kernel."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        reason = ""
        try:
            if torch.cuda._is_in_bad_fork():
                reason = "torch marks this process's forks as unable to use CUDA"
            elif ((gpus if gpus is not None else getattr(torch._C, "_cuda_getDeviceCount", lambda: 0)()) > 0
                  and torch.ones(1, device="cuda").add_(1).item() != 2):
                reason = "a kernel in a forked child computed a wrong value"
        except BaseException as error:  # noqa: BLE001 - the probe reports whatever stopped it
            reason = f"a forked child cannot use the GPU ({type(error).__name__}: {str(error)[:200]})"
        _write_all(write_end, reason.encode())
        os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 4096):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return f"the fork probe ended with status {os.waitstatus_to_exitcode(status)}"
    return b"".join(chunks).decode(errors="replace")


def _os_threads() -> list[str] | None:
    """The names of this process's threads, native ones too (an OpenMP or BLAS pool, a driver library's
    worker: a forked child would not inherit them); Linux only."""
    try:
        tasks = sorted(os.listdir("/proc/self/task"), key=int)
    except OSError:
        return None
    names = []
    for task in tasks:
        with contextlib.suppress(OSError):  # it ended meanwhile
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    return names


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _send(fd: int, message: dict[str, Any]) -> bool:
    """Write one reply; False when the caller no longer reads them."""
    try:
        _write_all(fd, (json.dumps(message) + "\n").encode())
    except OSError:
        return False
    return True


def _child(request: dict[str, Any], request_fd: int, reply_fd: int) -> None:
    """In the forked child: become a fresh pytest process as far as the run can tell (but for the hash seed
    of str and bytes, which only a new interpreter draws); never returns."""
    code = _CHILD_FAILED
    try:
        os.setsid()
        os.close(request_fd)
        os.close(reply_fd)
        for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _random_state_of_a_fresh_process()
        import atexit

        import pytest

        sys.argv = [str(Path(pytest.__file__).with_name("__main__.py")), *request["argv"]]  # as -m pytest has it

        code = int(pytest.main(list(request["argv"])))
        atexit._run_exitfuncs()  # what a process's normal exit runs (a run's own handlers too)
    except BaseException:  # noqa: BLE001 - whatever happens, the child must never return into the server's loop
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):  # exiting regardless
                stream.flush()
        os._exit(code)


def _random_state_of_a_fresh_process() -> None:
    """A plain process seeds Python's, NumPy's and torch's global generators from the OS; a fork would share
    the server's states (and whatever its imports drew from them) with every other child."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def serve(request_fd: int, reply_fd: int, preload: Sequence[str]) -> None:
    """The server's main loop; returns when the request pipe closes.

    A mutant's run is a pytest process whose start-up (torch, Dynamo and Inductor, transformers, hypothesis,
    syrupy, the harness) costs more than the test that kills it. The server imports those once
    (:data:`PRELOAD`), then forks one child per request. A child starts its own session (so it is stopped
    with everything it started), reads nothing, writes its output to the request's files, takes the
    request's working directory and environment, runs ``pytest.main(argv)`` and exits with pytest's
    status. The server never runs pytest itself, imports no test module of a suite, and enforces each
    child's time limit.

    It never initialises CUDA: a CUDA context does not survive a fork, and once a process has asked the
    driver anything, torch refuses CUDA in every child it forks. While it imports, torch answers "is there
    a GPU" from NVML, which does not reach the driver (``PYTORCH_NVML_BASED_CUDA_CHECK=1``), and the calls
    that would reach the driver (:data:`_CUDA_CALLS`, NVML's fallback among them) raise instead, so a module
    that asks at import time is left for the children to import (the ready message names it and the line
    that asked). Before it reports ready it forks a probe that asks torch whether its forks are poisoned
    and, on a GPU machine, runs a kernel; a fork that cannot use the GPU, or a Python thread left running
    by an import, makes it refuse to serve, and the caller starts plain processes instead.

    Protocol: JSON lines on two pipes (``request_fd``, ``reply_fd``). The server first says
    ``{"ready": true, ...}`` or ``{"ready": false, "reason": ...}``; a request ``{"id", "argv", "env",
    "cwd", "time_limit", "stdout", "stderr"}`` is answered ``{"id", "pid"}`` once forked and ``{"id",
    "exit", "timed_out"}`` once reaped (``exit`` as :attr:`subprocess.Popen.returncode`: negative for a
    signal). End of the request pipe stops the server and every child still running. :class:`ForkServer`
    starts this file by path, so the CUDA guard is in place before anything imports torch.
    """
    started = time.perf_counter()
    if sys.path and sys.path[0] == "":  # as ``python -m pytest`` has it: the working directory, by its path
        sys.path[0] = os.getcwd()
    guard = _CudaGuard()
    # Only while importing: the children run with the request's environment, the variable as the caller set it.
    caller_nvml_check = os.environ.get(_NVML_CHECK)
    os.environ[_NVML_CHECK] = "1"
    gpus: int | None = None
    try:
        skipped = _preload(preload, guard)
        if "torch" in sys.modules:
            # NVML's count: the driver stays untouched. Where NVML could not count, the probe child asks the driver.
            with contextlib.suppress(_CudaAsked):
                gpus = sys.modules["torch"].cuda.device_count()
    finally:
        guard.remove()
        if caller_nvml_check is None:
            del os.environ[_NVML_CHECK]
        else:
            os.environ[_NVML_CHECK] = caller_nvml_check
    gc.freeze()  # what was imported is never collected: the children's collections skip it, and its pages stay shared
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    torch = sys.modules.get("torch")
    cuda_initialized = bool(torch is not None and torch.cuda.is_initialized())
    reason = ""
    if threads:
        reason = f"an import started threads ({', '.join(threads)}), which a fork would not carry"
    elif cuda_initialized:
        reason = "CUDA was initialised while importing, so no forked child could use the GPU"
    else:
        reason = _fork_defect(gpus)
    _send(reply_fd, {"ready": not reason, "reason": reason, "pid": os.getpid(), "modules": len(sys.modules),
                     "seconds": round(time.perf_counter() - started, 2), "skipped": skipped,
                     "cuda_asked": guard.asked, "cuda_initialized": cuda_initialized, "gpus": gpus,
                     "os_threads": _os_threads()})
    if reason:
        return
    children: dict[int, dict[str, Any]] = {}  # pid -> {"id", "deadline", "timed_out"}
    pending = b""
    closed = False  # the caller closed the request pipe, or stopped reading replies: stop everything

    def close() -> None:
        nonlocal closed
        closed = True
        for pid in children:
            _kill_group(pid)

    while not closed or children:
        if closed:
            time.sleep(_POLL_SECONDS)
        elif select.select([request_fd], [], [], _POLL_SECONDS)[0]:
            data = os.read(request_fd, 1 << 16)
            pending += data
            while b"\n" in pending and not closed:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(request, request_fd, reply_fd)
                limit = request.get("time_limit")
                children[pid] = {"id": request["id"], "timed_out": False,
                                 "deadline": None if limit is None else time.monotonic() + limit}
                if not _send(reply_fd, {"id": request["id"], "pid": pid}):
                    close()
            if not data:
                close()
        now = time.monotonic()
        for pid, child in children.items():
            if child["deadline"] is not None and now > child["deadline"] and not child["timed_out"]:
                child["timed_out"] = True
                _kill_group(pid)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            child = children.pop(pid, None)
            if child is not None and not closed and not _send(reply_fd, {
                    "id": child["id"], "exit": os.waitstatus_to_exitcode(status), "timed_out": child["timed_out"]}):
                close()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(pid, signal.SIGKILL)


# --- the client (runs in the selfcheck process) --------------------------------------------------------

class _Waiter:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.pid: int | None = None
        self.exit: int | None = None
        self.timed_out = False


class ForkServer:
    """Start the server in ``cwd`` with ``environment`` (it imports :data:`PRELOAD` in the background);
    :meth:`run` one pytest command at a time per calling thread, from as many threads as runs may go at once.

    Close it (or use it as a context manager) to stop the server and any child still running."""

    START_SECONDS = 600.0  # the imports take seconds; a loaded machine, many more
    GRACE_SECONDS = 60.0  # past a run's own limit, a server that has not answered is taken for dead

    def __init__(self, *, environment: dict[str, str], cwd: Path, preload: Sequence[str] = PRELOAD,
                 niceness: int = 0) -> None:
        """``niceness``: added to the server's nice value, and so to every child it forks."""
        self.environment = dict(environment)
        # Open for the server's whole life (its output, read when it fails to start); close() closes it.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - outlives this method, closed by close()
        request_read, self._request_write = os.pipe()
        self._reply_read, reply_write = os.pipe()
        boot = "import runpy, sys; sys.argv.pop(0); runpy.run_path(sys.argv[0], run_name='__main__')"
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", boot, __file__, str(request_read), str(reply_write), json.dumps(list(preload))],
                cwd=cwd, env=self.environment, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                pass_fds=(request_read, reply_write), start_new_session=True)
            lower_priority(self._process.pid, niceness)
        finally:
            os.close(request_read)
            os.close(reply_write)
        self.ready_message: dict[str, Any] = {}
        self._gone = ""
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._waiters: dict[int, _Waiter] = {}
        self._next_id = 0
        self._reader = threading.Thread(target=self._read_replies, name="fork-server-replies", daemon=True)
        self._reader.start()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def pid(self) -> int:
        return self._process.pid

    def wait_ready(self, timeout: float | None = None) -> dict[str, Any]:
        """The server's ready message (what it imported, skipped, and its CUDA checks), once it has one."""
        if not self._ready.wait(self.START_SECONDS if timeout is None else timeout):
            self._fail(f"the fork server did not finish its imports within {self.START_SECONDS:g} s")
        if self._gone:
            raise ForkServerUnavailable(self._gone)
        return self.ready_message

    def run(self, command: Sequence[str], *, environment: dict[str, str], cwd: Path, time_limit: float | None,
            stdout: Path, stderr: Path) -> int | None:
        """Run ``command`` (``python -m pytest ARGS``) in a forked child; its exit status, or None when it was
        stopped at ``time_limit`` seconds. Raises :class:`ForkServerUnavailable` where a plain process must run
        it instead (the server does not serve this command or environment, refused to start, or died; a child
        it left behind is stopped first)."""
        command = list(command)
        if command[:3] != [sys.executable, "-m", "pytest"]:
            raise ForkServerUnavailable(f"the fork server runs '{sys.executable} -m pytest' only")
        differing = sorted(k for k in set(environment) | set(self.environment) if k not in PER_RUN_VARIABLES
                           and environment.get(k) != self.environment.get(k))
        if differing:
            raise ForkServerUnavailable(f"the fork server was started with other values of {', '.join(differing)}")
        self.wait_ready()
        waiter = _Waiter()
        with self._lock:
            if self._gone:
                raise ForkServerUnavailable(self._gone)
            self._next_id += 1
            number = self._next_id
            self._waiters[number] = waiter
            request = {"id": number, "argv": [*_CHILD_OPTIONS, *command[3:]], "env": environment, "cwd": str(cwd),
                       "time_limit": time_limit, "stdout": str(stdout), "stderr": str(stderr)}
            try:
                _write_all(self._request_write, (json.dumps(request) + "\n").encode())
            except OSError as error:
                self._waiters.pop(number)
                self._gone = self._gone or f"the fork server stopped reading requests ({error})"
                raise ForkServerUnavailable(self._gone) from None
        answered = waiter.done.wait(None if time_limit is None else time_limit + self.GRACE_SECONDS)
        with self._lock:
            self._waiters.pop(number, None)
        if waiter.exit is None:  # the server is gone: its orphan must not run on beside the replacement
            if waiter.pid is not None:
                _kill_group(waiter.pid)
            if not answered:
                self._fail(f"the fork server did not report a run within {self.GRACE_SECONDS:g} s past its limit")
            raise ForkServerUnavailable(self._gone)
        return None if waiter.timed_out else waiter.exit

    def close(self) -> None:
        """Stop the server: it stops every child still running, then exits."""
        with self._lock:
            self._gone = self._gone or "the fork server was closed"
        if not self._ready.is_set():  # still importing, with no child yet: nothing to wait for
            _kill_group(self._process.pid)
        with contextlib.suppress(OSError):
            os.close(self._request_write)
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill_group(self._process.pid)
            self._process.wait()
        self._reader.join(timeout=30)
        self._log.close()

    def _fail(self, reason: str) -> None:
        with self._lock:
            self._gone = self._gone or reason
        _kill_group(self._process.pid)  # the server only; its children have their own sessions
        raise ForkServerUnavailable(self._gone)

    def _read_replies(self) -> None:
        with os.fdopen(self._reply_read, "rb") as replies:
            for line in replies:
                message = json.loads(line)
                if "ready" in message:
                    self.ready_message = message
                    if not message["ready"]:
                        with self._lock:
                            self._gone = f"the fork server refused to serve: {message['reason']}"
                    self._ready.set()
                    continue
                with self._lock:
                    waiter = self._waiters.get(message["id"])
                if waiter is None:
                    continue
                if "pid" in message:
                    waiter.pid = message["pid"]
                else:
                    waiter.exit, waiter.timed_out = message["exit"], message["timed_out"]
                    waiter.done.set()
        status = self._process.wait()
        with self._lock:
            self._gone = self._gone or f"the fork server died (exit {status}{self._log_tail()})"
            waiters = list(self._waiters.values())
        self._ready.set()
        for waiter in waiters:
            waiter.done.set()

    def _log_tail(self) -> str:
        try:
            self._log.seek(0)
            lines = [line for line in self._log.read().decode(errors="replace").splitlines() if line.strip()]
        except (OSError, ValueError):
            return ""
        return f": {lines[-1][:200]}" if lines else ""


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]))
