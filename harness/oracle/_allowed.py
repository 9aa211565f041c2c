"""The differences from eager a component's contract allows, each with its reason: the one table, like the
tolerance table of :mod:`harness.compare`. A fact not listed here must be as eager leaves it."""

from __future__ import annotations

__all__ = ["ALLOWED", "allowed"]

# (component, fact) -> why the contract lets an implementation differ from eager there. Facts are those
# :func:`harness.oracle.check_call` names: "output strides", "output requires_grad", "output is_inference",
# "output attached to autograd", "output aliasing", "results outlive the next call", "rng", "process state",
# "module state", "input values".
ALLOWED: dict[tuple[str, str], str] = {
    ("graphs", "results outlive the next call"):
        "a replay writes the captured program's static outputs again (PyTorch's CUDA-graph contract: a caller "
        "clones what it keeps); the runner and the gather, built on it, must clone",
    ("graphs", "output aliasing"):
        "a replay returns the captured program's static output tensors, which eager's fresh outputs are not",
    ("graphs", "output is_inference"):
        "the static outputs were made at capture, under the capture's mode, not the replaying caller's",
    ("graphs", "output requires_grad"):
        "a replay runs no autograd: its outputs are plain buffers whatever the caller's grad mode",
    ("graphs", "output attached to autograd"):
        "a replay runs no autograd: its outputs are plain buffers whatever the caller's grad mode",
}


def allowed(component: str, fact: str) -> str | None:
    """The reason ``component`` may differ from eager in ``fact``, or None where it may not."""
    return ALLOWED.get((component, fact))
