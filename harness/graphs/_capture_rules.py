"""Which ATen ops a CUDA graph capture refuses, stated once for every backend.

Host syncs and ops whose output shape depends on tensor values; the emulated backend enforces this
list itself, so a CPU run fails where a GPU run would."""

from __future__ import annotations

from typing import Any

import torch

from harness.errors import CaptureError

__all__ = ["check_capturable", "HOST_SYNC_OPS"]

# Op packet names (``func.overloadpacket.__name__``) that read device data on the host or produce
# a data-dependent shape.
HOST_SYNC_OPS = frozenset(
    {
        "_local_scalar_dense",  # .item(), float(t), int(t), bool(t)
        "item",
        "is_nonzero",
        "equal",
        "nonzero",
        "argwhere",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "unique_dim_consecutive",
        "bincount",
        # Not _assert_async: it is a device-side assert, which CUDA captures and replays (measured on an
        # H200, torch 2.11); refusing it here made the emulation stricter than CUDA.
        "_assert_scalar",
    }
)


def _has_bool_index(args: tuple[Any, ...]) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


def _private_generator(generator: Any) -> bool:
    """Whether ``generator`` is one a program made itself: CUDA refuses to capture a draw from one ("Attempt to
    increase offset for a CUDA generator not in capture mode") unless it was registered with the graph."""
    if not isinstance(generator, torch.Generator):
        return False
    if generator.device.type == "cuda":
        index = generator.device.index if generator.device.index is not None else torch.cuda.current_device()
        default = torch.cuda.default_generators[index]
    elif generator.device.type == "cpu":
        default = torch.default_generator
    else:
        return False  # no default generator of this device type to tell it from
    # By state, not identity: the dispatcher hands an op a new Python object for the default generator too. A
    # generator of the program's own in the very state of the default one passes (a miss, never a false refusal).
    return not torch.equal(generator.get_state(), default.get_state())


def check_capturable(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise :class:`CaptureError` naming ``func`` when CUDA would refuse it during capture."""
    name = func.overloadpacket.__name__
    reason = None
    if name in HOST_SYNC_OPS:
        reason = "it synchronises with the host or has a data-dependent output shape"
    elif name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) < 3:
        reason = "repeat_interleave without output_size has a data-dependent output shape"
    elif name in ("index", "index_put", "index_put_", "_index_put_impl_") and _has_bool_index(args):
        reason = "boolean-mask indexing has a data-dependent output shape (it calls nonzero)"
    elif _private_generator(kwargs.get("generator")):
        reason = ("it draws from a generator of the program's own, not the device's default one: a graph replays "
                  "only the random streams it was told about (register the generator with the graph, "
                  "torch.cuda.CUDAGraph.register_generator_state, or draw from the default generator)")
    elif name in ("_to_copy", "copy_", "to"):
        source = args[1] if name == "copy_" else args[0]
        target_device = args[0].device if name == "copy_" else kwargs.get("device")
        if (
            isinstance(source, torch.Tensor)
            and source.device.type != "cpu"
            and target_device is not None
            and torch.device(target_device).type == "cpu"
        ):
            reason = "it copies device memory to the host"
    if reason:
        raise CaptureError(
            f"aten.{name} cannot be captured in a graph: {reason}. Move it out of the captured "
            "region (compute it before capture, or run it in an eager break)."
        )
