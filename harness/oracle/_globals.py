"""torch's global and thread-local settings, found by walking the installed torch, not listed by hand.

:func:`settings` walks ``torch``, ``torch._C``, the ``torch.backends`` modules (their flag properties and
functions) and, where initialised, the device modules, and keeps every getter of state: a name of the getter
form (``is_*``, ``are_*``, ``get_*``, ``current_*``; ``torch._C``'s with a leading ``_`` too) that takes no argument
and returns a plain comparable value. Getters taking a ``device_type`` are read once per device type torch
autocasts for (from its dispatch keys). A setter is paired to a getter by name (``get_x``/``set_x``,
``is_x_enabled``/``set_x_enabled``/``set_x``/``use_x``) or by the flag property that holds both. What is not
state, or costs a side effect to read, is in :data:`NOT_STATE` with the reason; nothing else is named."""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import re
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["Setting", "settings", "read", "NOT_STATE", "autocast_device_types"]

# Getter-form names: the reading half of a setting.
_GETTER = re.compile(r"^_?(is|are|get|current)_\w+$")
# Names of the getter form that report what the build or the machine is, never a setting a call could change.
_CAPABILITY = re.compile(r"(_available|_built|_supported|_version|_capability|_arch_list|_gencode_flags)$")

# Getters of the getter form that are not state a call could leave behind, or that cost a side effect to
# read: qualified name -> why.
NOT_STATE: dict[str, str] = {
    "torch.get_rng_state": "the random stream is compared as a stream of its own (rng), restored by its own setter",
    "torch.get_file_path": "a path inside the installed torch, not a setting",
    "torch.get_device_module": "returns a module, not a setting",
    "torch._C._get_cpp_backtrace": "a backtrace of the reading thread: differs at every read",
    "torch._C._get_all_dtypes": "the list of dtypes the build knows, a constant",
    "torch._C._get_privateuse1_backend_name": "the name the build registered, a constant",
    "torch._C._get_DTensor_sharding_propagator_cache_stats": "a cache's hit counters, not a caller's setting",
    "torch._C._get_caught_jit_exception_class_name": "diagnostics of the last TorchScript exception",
    "torch._C._get_caught_jit_exception_original_msg": "diagnostics of the last TorchScript exception",
    "torch._C._get_max_operator_version": "a constant of the build",
    "torch._C._get_upgraders_map_size": "a constant of the build",
    "torch._C._get_upgraders_entry_map": "a constant of the build",
    "torch._C._get_operator_version_map": "a constant of the build",
    "torch._C._get_graph_exec_group": "a TorchScript executor's group counter, bumped by every scripted run",
    "torch._C._get_value_trace": "a TorchScript tracer's value map, only meaningful while tracing",
    "torch._C._get_dispatch_mode": "a handle of a mode object; the mode stack's length is read instead",
    "torch.cuda.current_blas_handle": "the first read on a thread and device creates the handle (a side effect); "
                                      "no caller sets it",
    "torch.cuda.get_rng_state": "the random stream is compared as a stream of its own (rng)",
    "torch.cuda.get_rng_state_all": "the random stream is compared as a stream of its own (rng)",
    "torch.cuda.get_device_properties": "a constant of the device",
    "torch.cuda.get_device_name": "a constant of the device",
    "torch.cuda.get_device_capability": "a constant of the device",
    "torch.cuda.get_allocator_backend": "fixed when CUDA initialises",
    "torch.cuda.get_per_process_memory_fraction": "reads through the allocator; memory is a resource checked by "
                                                  "growth, not a setting",
}

# Value types a snapshot can hold and compare cheaply with ==.
_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout,
          enum.Enum, *((torch.Stream,) if hasattr(torch, "Stream") else ()))


@dataclasses.dataclass(frozen=True)
class Setting:
    """One piece of global or thread-local state: its qualified name, how to read it, and how to set it back
    (None where torch offers no setter)."""

    name: str
    read: Callable[[], Any]
    write: Callable[[Any], None] | None = None


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(item) for item in value)
    return isinstance(value, _PLAIN) and not isinstance(value, torch.Tensor)


def _takes_no_argument(function: Callable[..., Any], name: str) -> bool | None:
    """True/False from the signature (or a C function's documented one); None where neither says."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        first = (getattr(function, "__doc__", None) or "").strip().split("\n", 1)[0]
        match = re.match(rf"{re.escape(name)}\((.*?)\)", first)
        return None if match is None else match.group(1).strip() in ("", "self")
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in signature.parameters.values())


def _takes_device_type(function: Callable[..., Any]) -> bool:
    """Whether the getter reads one value per device type: its first parameter is ``device_type``; a C getter has
    no signature, and its argument parser names the parameter when handed an object of no type it takes."""
    try:
        parameters = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        try:
            function(object())
        except TypeError as refusal:
            return "'device_type'" in str(refusal)
        except Exception:  # refused otherwise: not a getter of one argument
            return False
        return False
    return parameters[:1] == ["device_type"]


@functools.cache
def autocast_device_types() -> tuple[str, ...]:
    """The device types torch can autocast on, from its dispatch keys (``AutocastCPU`` -> ``cpu``)."""
    found = []
    for key in torch._C.DispatchKey.__members__:
        if key.startswith("Autocast") and key != "AutocastPrivateUse1":
            device_type = key[len("Autocast"):].lower()
            try:
                if torch.amp.is_autocast_available(device_type):
                    found.append(device_type)
            except RuntimeError:  # a device type this build has no autocast for
                continue
    return tuple(found)


def _setter_names(name: str) -> Iterator[str]:
    private = "_" if name.startswith("_") else ""
    stem = re.sub(r"^_?(is|are|get|current)_", "", name)
    bare = stem.removesuffix("_enabled")
    yield from (f"{private}set_{stem}", f"{private}set_{bare}", f"{private}use_{bare}", f"{private}set_{bare}_enabled")


def _setter(namespace: Any, name: str) -> Callable[..., Any] | None:
    for candidate in _setter_names(name):
        setter = getattr(namespace, candidate, None)
        if callable(setter):
            return setter
    return None


def _probe(read: Callable[[], Any]) -> tuple[bool, Any]:
    """Read once: (True, value) where it answers with a plain value and without a warning (a deprecated alias of
    another getter warns at every read: the read itself would be a side effect)."""
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            value = read()
        except Exception:  # needs arguments, or what this process lacks (a device, a build option): not state here
            return False, None
    return _plain(value) and not warned, value


def _function_settings(namespace: Any, prefix: str, seen: set[int]) -> Iterator[Setting]:
    for name in sorted(dir(namespace)):
        qualified = f"{prefix}.{name}"
        if not _GETTER.match(name) or _CAPABILITY.search(name) or qualified in NOT_STATE:
            continue
        if name.startswith("_") and namespace is not torch._C:
            continue  # a module's private helpers are not its settings; torch._C's getters are
        function = getattr(namespace, name, None)
        if not callable(function) or isinstance(function, type):
            continue
        if id(function) in seen:
            continue  # one function under two names (torch.is_grad_enabled is torch._C's): read it once
        seen.add(id(function))
        setter = _setter(namespace, name)
        if _takes_device_type(function):
            for device_type in autocast_device_types():
                yield from _checked(f"{qualified}({device_type!r})", functools.partial(function, device_type),
                                    None if setter is None else functools.partial(setter, device_type))
        elif _takes_no_argument(function, name) is not False:  # undocumented C getters: the probe's call decides
            yield from _checked(qualified, function, setter)


def _checked(name: str, read: Callable[[], Any], write: Callable[..., Any] | None) -> Iterator[Setting]:
    if _probe(read)[0]:
        yield Setting(name, read, write)


def _flag_settings(module: Any, prefix: str) -> Iterator[Setting]:
    """A ``torch.backends`` flag module's flags: its properties holding a getter and a setter (``cudnn.enabled``),
    and the public plain values of the module it wraps (``opt_einsum.strategy``), both read and set as attributes."""
    if not isinstance(module, torch.backends.PropModule):
        return
    names = [name for name, prop in vars(type(module)).items() if isinstance(prop, torch.backends.ContextProp)]
    wrapped = getattr(module, "m", None)
    if isinstance(wrapped, types.ModuleType):
        names += [name for name, value in vars(wrapped).items()
                  if not name.startswith("_") and not name.isupper() and _plain(value)]
    for name in sorted(set(names)):
        qualified = f"{prefix}.{name}"
        if qualified not in NOT_STATE:
            yield from _checked(qualified, functools.partial(getattr, module, name),
                                functools.partial(setattr, module, name))


def _backend_modules() -> Iterator[tuple[str, Any]]:
    for name in sorted(dir(torch.backends)):
        module = getattr(torch.backends, name)
        if not name.startswith("_") and isinstance(module, types.ModuleType):
            yield f"torch.backends.{name}", module


def _device_modules() -> Iterator[tuple[str, Any]]:
    # Reading a device module's getters initialises the device (a side effect a snapshot must not have): its
    # settings are read once the process has initialised it.
    for device_type in autocast_device_types():
        module = getattr(torch, device_type, None)
        initialised = getattr(module, "is_initialized", None)
        if device_type != "cpu" and callable(initialised) and initialised():
            yield f"torch.{device_type}", module


@functools.cache
def _discovered(device_key: tuple[str, ...]) -> tuple[Setting, ...]:
    found: dict[str, Setting] = {}
    seen: set[int] = set()
    namespaces = [("torch", torch), ("torch._C", torch._C), *_backend_modules(), *_device_key_modules(device_key)]
    for prefix, namespace in namespaces:
        for setting in [*_function_settings(namespace, prefix, seen), *_flag_settings(namespace, prefix)]:
            found.setdefault(setting.name, setting)
    return tuple(found.values())


def _device_key_modules(device_key: tuple[str, ...]) -> list[tuple[str, Any]]:
    return [(f"torch.{device_type}", getattr(torch, device_type)) for device_type in device_key]


def settings() -> tuple[Setting, ...]:
    """Every setting of the installed torch found by the rules above (cached per set of initialised devices)."""
    return _discovered(tuple(prefix.split(".", 1)[1] for prefix, _ in _device_modules()))


def read(found: tuple[Setting, ...]) -> dict[str, Any]:
    """``{name: value}`` of ``found`` now; a getter that stops answering reads as its error's type."""
    values: dict[str, Any] = {}
    for setting in found:
        try:
            value = setting.read()
        except Exception as error:  # noqa: BLE001 - a getter that fails now is a state of its own
            value = f"<{type(error).__name__}>"
        values[setting.name] = tuple(value) if isinstance(value, list) else value
    return values
