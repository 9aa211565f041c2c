"""A pool of rank processes forming one ``torch.distributed`` group, for multi-rank tests.

Safe to use: :class:`RankPool` (``run(step, fn, *args)`` runs a module-level function on every rank
under a deadline) and :class:`RankFailure`, which names every rank's fate when a step fails."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import multiprocessing.connection
import os
import pickle
import socket
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

__all__ = ["RankContext", "RankFailure", "RankPool", "free_loopback_port"]

LOOPBACK = "127.0.0.1"


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


class RankFailure(AssertionError):
    """A step failed on at least one rank; the message says, per rank, what happened in which step."""

    def __init__(self, step: str, fates: dict[int, str], *, raised: dict[int, str] | None = None) -> None:
        self.step, self.fates, self.raised = step, fates, raised or {}
        lines = [f"step {step!r} failed on rank(s) {sorted(r for r, f in fates.items() if f != 'finished')}:"]
        lines += [f"  rank {rank}: {fate}" for rank, fate in sorted(fates.items())]
        for rank, text in sorted(self.raised.items()):
            lines.append(f"--- rank {rank} traceback ---\n{text.rstrip()}")
        super().__init__("\n".join(lines))


@dataclasses.dataclass
class RankContext:
    """What a step function gets on its rank: its place in the group, its device, and ``state``, a
    dict that persists across steps until the pool restarts (cache models and runners there)."""

    rank: int
    world_size: int
    device: torch.device
    backend: str
    state: dict[str, Any] = dataclasses.field(default_factory=dict)
    step: str = ""

    @property
    def group(self) -> Any:
        import torch.distributed as dist

        return dist.group.WORLD


def _send(connection: multiprocessing.connection.Connection, message: Any) -> None:
    # Plain pickle, by value: torch's multiprocessing pickler would share tensors' memory with the
    # receiver, tying their lifetime to a rank process that a failed step may kill.
    connection.send_bytes(pickle.dumps(message))


def _receive(connection: multiprocessing.connection.Connection) -> Any:
    return pickle.loads(connection.recv_bytes())


def _form_group(context: RankContext, port: int, timeout_s: float) -> None:
    import torch.distributed as dist

    if context.device.type == "cuda":
        torch.cuda.set_device(context.device)
    dist.init_process_group(context.backend, init_method=f"tcp://{LOOPBACK}:{port}", rank=context.rank,
                            world_size=context.world_size, timeout=datetime.timedelta(seconds=timeout_s))
    context.state.clear()


def _tear_down_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        # A broken group may refuse a clean shutdown; it is gone either way.
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _exit_with_the_parent(parent: int) -> None:
    """A rank outlives nothing: when the test process is gone (even by ``os._exit``, which skips the
    clean-up that terminates daemonic children) the rank exits, also from inside a blocked collective.
    Orphaned ranks would hold the parent's output pipes open and hang whoever waits for them."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="harness-rank-parent-watch", daemon=True).start()


def _child(rank: int, world_size: int, backend: str, device: str, port: int, timeout_s: float,
           connection: multiprocessing.connection.Connection, threads: int, parent: int) -> None:
    _exit_with_the_parent(parent)
    torch.set_num_threads(threads)
    context = RankContext(rank, world_size, torch.device(device), backend)
    try:
        _form_group(context, port, timeout_s)
        _send(connection, ("ok", None))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the step
        _send(connection, ("error", traceback.format_exc()))
        return
    while True:
        try:
            message = _receive(connection)
        except (EOFError, OSError):
            os._exit(0)  # the test process is gone: nobody to tear the group down with
        kind = message[0]
        if kind == "close":
            break
        _, step, fn, args = message
        context.step = step
        text = None
        try:
            result = fn(context, *args)
        except BaseException:  # noqa: BLE001 - any failure of the step is the test's, reported per rank
            text = traceback.format_exc()
        if text is not None:
            _send(connection, ("error", text))
            # Exit: peers blocked in a collective with this rank get an error once its connections close.
            # Destroying the group is not enough, captured graphs and models still hold it open.
            connection.close()
            os._exit(1)
        try:
            _send(connection, ("ok", result))
        except Exception:  # noqa: BLE001 - an unpicklable result is the step's failure
            _send(connection, ("error", traceback.format_exc()))
    _tear_down_group()


class RankPool:
    """``world_size`` rank processes in one process group, living across tests.

    The children (torch's multiprocessing, ``spawn``) rendezvous on 127.0.0.1 at a free port and form one
    group. :meth:`run` runs one *step* on every rank: a module-level function ``fn(rank_context, *args)``
    (picklable by name), returning each rank's result. Every step has a deadline, so nothing a rank does can
    hang the caller. A failed step raises :class:`RankFailure` naming every rank's fate (raised, with its
    traceback; still running past the deadline, i.e. hung in a collective; died, with its exit code;
    finished). A rank that raises reports and exits, so a peer blocked in a collective with it gets an
    error instead of waiting forever; peers still running after ``grace`` count as hung and are killed.
    After any failed step the pool starts afresh on the next one.

    ``backend``: ``"gloo"`` (CPU) or ``"nccl"`` (rank ``r`` on ``cuda:r``). ``step_timeout`` bounds
    every step (seconds); ``group_timeout`` is the process group's own collective timeout. Both are
    generous because a rank legitimately waits in a collective for a peer that is still compiling or
    capturing, on a CPU shared with other jobs; a rank that raises or dies fails the step at once.
    """

    def __init__(self, world_size: int, *, backend: str = "gloo", step_timeout: float = 120.0,
                 group_timeout: float = 60.0, grace: float = 5.0) -> None:
        if world_size < 1:
            raise ValueError(f"a rank pool needs at least one rank, got {world_size}")
        self.world_size = world_size
        self.backend = backend
        self.step_timeout = step_timeout
        self.group_timeout = group_timeout
        self.grace = grace  # how long peers of a raising rank get to report before they count as hung
        self.starts = 0  # how many times the processes were started (a test may assert restarts)
        # fork starts a rank in milliseconds where spawn re-imports torch (seconds of CPU per rank);
        # CUDA cannot be forked, so NCCL ranks, and any ranks of a process that initialised CUDA, are
        # spawned. HARNESS_RANK_START overrides.
        forkable = "fork" in mp.get_all_start_methods() and backend != "nccl" and not torch.cuda.is_initialized()
        default = "fork" if forkable else "spawn"
        self.start_method = os.environ.get("HARNESS_RANK_START", default)
        self._processes: list[Any] = []
        self._connections: list[multiprocessing.connection.Connection] = []

    # -- life cycle ---------------------------------------------------------------------------

    def _device(self, rank: int) -> str:
        return f"cuda:{rank}" if self.backend == "nccl" else "cpu"

    def start(self) -> None:
        self.close()
        if self.start_method == "fork":
            # Imported once here, inherited by every fork: a rank importing Dynamo (which a capture's
            # force_eager stance does) would otherwise spend seconds of CPU at each pool start.
            import torch._dynamo  # noqa: F401
        context = mp.get_context(self.start_method)
        port = free_loopback_port()
        threads = max(1, (os.cpu_count() or 1) // self.world_size) if self.backend == "nccl" else 1
        for rank in range(self.world_size):
            parent_end, child_end = context.Pipe()
            process = context.Process(
                target=_child, daemon=True, name=f"harness-rank-{rank}",
                args=(rank, self.world_size, self.backend, self._device(rank), port, self.group_timeout,
                      child_end, threads, os.getpid()))
            process.start()
            child_end.close()
            self._processes.append(process)
            self._connections.append(parent_end)
        self.starts += 1
        self._await_ready("start")

    def _await_ready(self, step: str) -> None:
        replies = self._collect(step, self.step_timeout)
        if any(kind != "ok" for kind, _ in replies.values()):
            self._fail(step, replies)

    def close(self) -> None:
        for connection in self._connections:
            with contextlib.suppress(BrokenPipeError, OSError):
                _send(connection, ("close",))
        for process in self._processes:
            process.join(timeout=2)
            if process.is_alive():
                process.kill()
                process.join(timeout=2)
        for connection in self._connections:
            connection.close()
        self._processes, self._connections = [], []

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return bool(self._processes) and all(p.is_alive() for p in self._processes)

    # -- steps --------------------------------------------------------------------------------

    def run(self, step: str, fn: Callable[..., Any], *args: Any,
            rank_args: list[tuple[Any, ...]] | None = None, timeout: float | None = None) -> list[Any]:
        """Run ``fn(context, *args, *rank_args[rank])`` on every rank; their results in rank order.

        Raises :class:`RankFailure` when any rank raises, dies or runs past ``timeout`` (default
        ``step_timeout``), naming each rank's fate in ``step``.
        """
        if not self.alive:
            self.start()
        for rank, connection in enumerate(self._connections):
            extra = tuple(rank_args[rank]) if rank_args is not None else ()
            _send(connection, ("step", step, fn, (*args, *extra)))
        replies = self._collect(step, self.step_timeout if timeout is None else timeout)
        if any(kind != "ok" for kind, _ in replies.values()):
            self._fail(step, replies)
        return [replies[rank][1] for rank in range(self.world_size)]

    def _collect(self, step: str, timeout: float) -> dict[int, tuple[str, Any]]:
        """Each rank's reply: ("ok", result), ("error", traceback), ("hung", None) or ("died", code)."""
        replies: dict[int, tuple[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while len(replies) < self.world_size:
            now = time.monotonic()
            if now >= deadline:
                break
            waiting = {rank: self._connections[rank] for rank in range(self.world_size) if rank not in replies}
            ready = multiprocessing.connection.wait(list(waiting.values()), timeout=min(0.5, deadline - now))
            for rank, connection in waiting.items():
                if connection in ready:
                    try:
                        replies[rank] = _receive(connection)
                    except (EOFError, OSError):
                        self._processes[rank].join(timeout=1)
                        replies[rank] = ("died", self._processes[rank].exitcode)
                elif not self._processes[rank].is_alive():
                    replies[rank] = ("died", self._processes[rank].exitcode)
            if any(kind != "ok" for kind, _ in replies.values()):
                # Someone failed: the others get a grace period to report (their blocked
                # collectives error out once the failed rank's group is gone), then count as hung.
                deadline = min(deadline, time.monotonic() + self.grace)
        for rank in range(self.world_size):
            replies.setdefault(rank, ("hung", None))
        return replies

    def _fail(self, step: str, replies: dict[int, tuple[str, Any]]) -> None:
        fates, raised = {}, {}
        for rank, (kind, payload) in sorted(replies.items()):
            if kind == "ok":
                fates[rank] = "finished"
            elif kind == "error":
                fates[rank] = "raised: " + payload.strip().splitlines()[-1]
                raised[rank] = payload
            elif kind == "died":
                fates[rank] = f"died (exit code {payload}) during the step"
            else:
                fates[rank] = "hung: did not finish the step within its deadline (killed)"
        self.close()  # ranks that raised have exited, the others are killed; the next step starts afresh
        raise RankFailure(step, fates, raised=raised)
