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
        "replay() returns graph.output itself, the objects fn returned at capture, and every replay refreshes them "
        "in place (docs/graphs.md, write-back clause: a handle to the output taken once reads each later replay's "
        "values; PyTorch's CUDA graphs rewrite their static outputs the same way): a caller clones what it keeps, "
        "as the runner and the gather built on graphs must",
}


def allowed(component: str, fact: str) -> str | None:
    """The reason ``component`` may differ from eager in ``fact``, or None where it may not."""
    return ALLOWED.get((component, fact))
