"""The state a call can leave behind: the process's modes and the modules it was given.

A snapshot is a flat ``{name: value}`` of comparable facts; :func:`changes` lists the names whose value
differs between two snapshots. Tensor values are kept as clones (the models the suites use are small); a
parameter written in place by a replayed kernel bumps no version counter, so values are compared, not versions."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from harness.oracle import _globals

__all__ = ["process_state", "process_state_kept", "restore_settings", "module_state", "rng_state", "set_rng_state",
           "changes"]

# Hook tables a module keeps; a caller's handle removes its hook from the very dict it was added to, so the
# dict's identity is part of the state as much as its entries.
_HOOK_TABLES = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
                "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
                "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


def _global_hook_tables() -> Iterator[tuple[str, dict[Any, Any]]]:
    # torch.nn's process-wide hook tables: its module's ``_global_*`` dicts, found by name, not listed.
    from torch.nn.modules import module as nn_module

    for name, table in sorted(vars(nn_module).items()):
        if name.startswith("_global_") and isinstance(table, dict):
            yield name, table


def process_state() -> dict[str, Any]:
    """Modes and settings of this process that a call could change and fail to restore: every setting of the
    installed torch (:func:`harness.oracle._globals.settings`, found by introspection), torch.nn's global hook
    tables, Python's garbage collector and the batch the harness publishes to attention."""
    from harness.batch import published_batch

    state = _globals.read(_globals.settings())
    state["gc.isenabled"] = gc.isenabled()
    # The batch attention reads out of band (harness.batch.forward_context): eager publishes it for its forward
    # only, so a call that leaves one published feeds a stale batch to the next attention outside a forward.
    published = published_batch()
    state["published forward context"] = id(published) if published is not None else None
    for name, hooks in _global_hook_tables():
        state[f"torch.nn global hooks {name}"] = (id(hooks), tuple((k, id(v)) for k, v in hooks.items()))
    return state


def restore_settings(before: dict[str, Any]) -> list[str]:
    """Set back every setting with a setter whose value differs from ``before`` (a :func:`process_state`), and
    the garbage collector; return the names that refused to go back (a setter torch allows only once)."""
    refused = []
    for setting in _globals.settings():
        if setting.write is None or setting.name not in before:
            continue
        # One write can restore others (two getters of one flag): read each again before writing it.
        if _globals.read((setting,))[setting.name] != before[setting.name]:
            try:
                setting.write(before[setting.name])
            except (RuntimeError, ValueError, TypeError):
                refused.append(setting.name)
    (gc.enable if before["gc.isenabled"] else gc.disable)()
    return refused


@contextlib.contextmanager
def process_state_kept() -> Iterator[None]:
    """Put back, after the block, every setting of :func:`process_state` torch has a setter for (grad mode, default
    dtype, deterministic algorithms, matmul precision, threads, autocast per device type, backend flags, ...) and
    the garbage collector: for the harness's own start-up call of an implementation (a smoke call), whose
    leftovers would otherwise hide the same change made by the calls the suites check."""
    before = process_state()
    try:
        yield
    finally:
        restore_settings(before)


def rng_state() -> tuple[torch.Tensor, ...]:
    """The default generators' states: the CPU's, and each CUDA device's where CUDA is initialised."""
    states = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += torch.cuda.get_rng_state_all()
    return tuple(states)


def set_rng_state(states: tuple[torch.Tensor, ...]) -> None:
    torch.set_rng_state(states[0])
    if len(states) > 1:
        torch.cuda.set_rng_state_all(list(states[1:]))


def _tensor_state(prefix: str, tensor: torch.Tensor | None, state: dict[str, Any]) -> None:
    if tensor is None:
        state[prefix] = None
        return
    state[f"{prefix} object"] = id(tensor)
    state[f"{prefix} metadata"] = (tensor.dtype, tuple(tensor.shape), tensor.stride(), tensor.device,
                                   tensor.requires_grad, tensor.untyped_storage().data_ptr() if tensor.numel() else 0)
    state[f"{prefix} values"] = tensor.detach().clone()
    grad = tensor.grad if tensor.is_leaf else None
    state[f"{prefix} grad object"] = None if grad is None else id(grad)
    state[f"{prefix} grad"] = None if grad is None else grad.detach().clone()


def module_state(modules: Iterable[torch.nn.Module]) -> dict[str, Any]:
    """Everything of ``modules`` (and their submodules) a caller can see: parameters and buffers (object, metadata,
    values, grad), the training flag, a ``forward`` set on the instance, and the hook tables."""
    state: dict[str, Any] = {}
    for index, root in enumerate(modules):
        for name, module in root.named_modules(remove_duplicate=False):
            where = f"module {index}{'.' + name if name else ''}"
            state[f"{where} training"] = module.training
            state[f"{where} instance forward"] = id(module.__dict__.get("forward"))
            state[f"{where} class"] = type(module)
            for table in _HOOK_TABLES:
                hooks = module.__dict__.get(table)
                if hooks is not None:
                    state[f"{where} {table}"] = (id(hooks), tuple((k, id(v)) for k, v in hooks.items()))
            for kind, members in (("parameter", module._parameters), ("buffer", module._buffers)):
                state[f"{where} {kind} names"] = tuple(members)
                for member, tensor in members.items():
                    _tensor_state(f"{where} {kind} {member}", tensor, state)
    return state


def _same(left: Any, right: Any) -> bool:
    if left is right:  # the same object (a dtype, a cached int, a tensor kept by two snapshots) is itself
        return True
    if isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor):
        if not (isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor)):
            return False
        if left.shape != right.shape or left.dtype != right.dtype:
            return False
        if left.dtype.is_floating_point:  # bits: NaN equals itself, -0.0 is not 0.0
            bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[left.element_size()]
            return bool(torch.equal(left.contiguous().view(bits), right.contiguous().view(bits)))
        return bool(torch.equal(left, right))
    if isinstance(left, tuple) and isinstance(right, tuple):
        return len(left) == len(right) and all(_same(a, b) for a, b in zip(left, right))
    return bool(left == right)


def _same_fact(left: Any, right: Any) -> bool:
    # A snapshot's tuples hold no tensors (values and grads are facts of their own), so they compare with == in C:
    # a snapshot holds about a thousand of them, compared twice per checked call.
    if type(left) is tuple and type(right) is tuple:
        return left == right
    return _same(left, right)


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Names whose value differs between two snapshots (added or removed names included), in a stable order."""
    names = list(dict.fromkeys([*before, *after]))
    return [name for name in names
            if name not in before or name not in after or not _same_fact(before[name], after[name])]
