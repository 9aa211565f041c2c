"""Which transformers-zoo stacks capture, per transformers release and verdict class, and why the classes differ.

:func:`verdict_class` (``cpu``, ``cuda-sm90``, ...), :data:`UNCAPTURABLE` per release and class, and
:data:`DEVICE_DIFFERENCES` per release: every emulated-versus-CUDA difference with its cause, which
``suites/runner/architectures`` holds to (an unlisted difference fails, and so does a stale one). What a stack's
code does is transformers' own, so each record names the release it was made with; a release without one is
compared with the nearest (:func:`uncapturable`), and what moved is upstream drift, not a failure."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

__all__ = [
    "UNCAPTURABLE",
    "DEVICE_DIFFERENCES",
    "COMPARED_CLASSES",
    "Recorded",
    "verdict_class",
    "golden_name",
    "uncapturable",
    "verdict_differences",
]

# The stacks the harness rule cannot capture, per transformers release and verdict class (experts: batched_mm),
# with what stops them: the op on the emulated backend (it names it), the transformers call site on CUDA (read
# off the error's last transformers frame on the H200; CUDA's own message does not name the op).
UNCAPTURABLE: dict[str, dict[str, dict[str, str]]] = {
    "5.24.0": {
        "cpu": {
            # _split_heads indexes with a Python list (fused_qkv[..., [-2], :]), an index tensor made from
            # Python data
            "falcon": "aten.lift_fresh (modeling_falcon _split_heads: a list index)",
            "gpt-neo": "aten.lift_fresh (modeling_gpt_neo _attn: torch.tensor(mask_value, device=...))",
            "jetmoe": "aten._local_scalar_dense (Tensor.tolist)",  # routing reads expert counts on the host
        },
        # Recorded on an H200 (torch 2.11+cu130). CUDA says of each: "Cannot copy between CPU and CUDA tensors
        # during CUDA graph capture unless the CPU tensor is pinned".
        "cuda-sm90": {
            "falcon": "a list index in _split_heads: the index tensor is made on the host and copied",
            "gpt-neo": "torch.tensor(mask_value, device=...) in _attn: a copy from pageable host memory",
            "jetmoe": "expert_size.tolist() in its router: a host read of expert counts",
            "phimoe": "inv_freq rebuilt on the host in its rotary embedding and copied (see DEVICE_DIFFERENCES)",
        },
    },
    "5.25.0": {
        # falcon's _split_heads no longer indexes with a Python list: its stack captures
        "cpu": {
            "gpt-neo": "aten.lift_fresh (modeling_gpt_neo _attn: torch.tensor(mask_value, device=...))",
            "jetmoe": "aten._local_scalar_dense (Tensor.tolist)",
        },
    },
}

# Stacks whose CUDA verdict differs from the emulated one, per transformers release, with the cause. Only what
# the CPU cannot know belongs here (a kernel path chosen by device type); what it can know it refuses as CUDA does.
DEVICE_DIFFERENCES: dict[str, dict[str, str]] = {
    "5.24.0": {
        # modeling_phimoe.py:92 (PhimoeRotaryEmbedding.forward)
        "phimoe": ("its rotary embedding rebuilds inv_freq at every call with torch.arange and no device (on the "
                   "host) and copies it with .to(device=x.device): on CUDA a copy from pageable host memory, which "
                   "capture refuses; on the CPU the host is the device, so the emulation sees no copy to refuse"),
    },
}

# The classes whose recorded matrices are compared: the emulation and the GPU class it stands for.
COMPARED_CLASSES = ("cpu", "cuda-sm90")


@dataclasses.dataclass(frozen=True)
class Recorded:
    """The stacks a class cannot capture, as recorded with transformers ``version``; ``exact`` where that is the
    installed release (else the nearest recorded one stands in for it)."""

    version: tuple[int, ...]
    stacks: dict[str, str]
    exact: bool


def verdict_class(backend_name: str, device: torch.device | str) -> str:
    """``cpu`` (emulated on the CPU), ``cuda-sm<major><minor>`` (CUDA graphs on that GPU), or
    ``emulated-cuda-sm..`` (the emulation over CUDA tensors)."""
    from harness.golden import device_class

    kind = device_class(torch.device(device))
    if backend_name == "emulated" and kind != "cpu":
        return f"emulated-{kind}"
    return kind


def golden_name(backend_name: str, device: torch.device | str, experts: str) -> str:
    """The capture matrix golden's name for this run: the verdict class and the experts implementation."""
    return f"{verdict_class(backend_name, device)}-{experts}"


def uncapturable(kind: str, *, transformers: tuple[int, ...] | None = None) -> Recorded | None:
    """The stacks class ``kind`` cannot capture under the installed transformers (or release ``transformers``):
    that release's own record, else the nearest release that recorded ``kind``; None where none did."""
    from harness.upstream import installed_version, nearest_version, parse_version

    version = transformers if transformers is not None else installed_version("transformers") or ()
    releases = {parse_version(release): classes[kind] for release, classes in UNCAPTURABLE.items() if kind in classes}
    chosen = tuple(version) if tuple(version) in releases else nearest_version(tuple(version), releases)
    if chosen is None:
        return None
    return Recorded(version=chosen, stacks=releases[chosen], exact=chosen == tuple(version))


def verdict_differences(emulated: Mapping[str, Any], cuda: Mapping[str, Any], *,
                        rule: str = "harness") -> dict[str, tuple[bool, bool]]:
    """``{stack: (captures emulated, captures on CUDA)}`` where two recorded matrices disagree on
    ``rule``'s stack; stacks unavailable in either are left out (nothing was measured)."""
    differences = {}
    for name in sorted(set(emulated) & set(cuda)):
        left, right = emulated[name].get(rule), cuda[name].get(rule)
        if left is None or right is None:
            continue
        if left["captures"] != right["captures"]:
            differences[name] = (left["captures"], right["captures"])
    return differences
