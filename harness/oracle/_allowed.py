"""The differences from eager a component's contract allows, each with its reason: the one table, like the
tolerance table of :mod:`harness.compare`. A fact not listed here must be as eager leaves it."""

from __future__ import annotations

__all__ = ["ALLOWED", "allowed", "NOT_DRAWN"]

# (component, fact) -> why the contract lets an implementation differ from eager there. Facts are those
# :func:`harness.oracle.check_call` names: "output strides", "output requires_grad", "output is_inference",
# "output storage", "output attached to autograd", "output aliasing", "objects kept alive", "growth over a run",
# "results outlive the next call", "rng", "process state",
# "module state", "input values"; one setting of the process as "process state: <its name in process_state()>",
# and a caller's context a component may ignore as "caller context: <setting name>", or "caller context" for every
# setting (then it is not drawn for that component); "caller context changed after capture" for a component that
# replays what it captured (its context is then drawn once per example and held from the capture to the last replay).
ALLOWED: dict[tuple[str, str], str] = {
    ("graphs", "results outlive the next call"):
        "replay() returns graph.output itself, the objects fn returned at capture, and every replay refreshes them "
        "in place (docs/graphs.md, write-back clause: a handle to the output taken once reads each later replay's "
        "values; PyTorch's CUDA graphs rewrite their static outputs the same way): a caller clones what it keeps, "
        "as the runner and the gather built on graphs must",
    ("graphs", "output storage"):
        "a replay's outputs are the capture's static tensors, carved out of the graph's memory pool (docs/graphs.md, "
        "pool clause): a block the pool hands a capture may be larger than the tensor placed in it, as a CUDA "
        "caching allocator's blocks are; the pool, not the caller, owns that memory",
    ("graphs", "caller context changed after capture"):
        "a replay runs the kernels its capture recorded, in the context of the capture (the autocast state, default "
        "dtype, matmul precision, ... in force then): a CUDA graph cannot see a context set after its capture, so a "
        "replay equals eager run in the capture's context (docs/graphs.md, caller's context clause); a caller who "
        "changes it recaptures. The caller's context is drawn once per example and held from the first capture to "
        "the last replay, around eager alike (harness.oracle._contexts.example_caller_context)",
    ("runner", "caller context changed after capture"):
        "the runner replays layer stacks captured at its construction, in the construction's context, as the graphs "
        "row says (docs/runner.md): the caller's context is drawn once per example and held from the runner's "
        "construction to its last call, around eager alike",
}


def allowed(component: str, fact: str) -> str | None:
    """The reason ``component`` may differ from eager in ``fact``, or None where it may not."""
    return ALLOWED.get((component, fact))


# Settings with a setter that hypothesis does not draw as a caller's context (harness.oracle._contexts), for any
# component: setting name (as harness.oracle._globals names it) -> why a caller's context cannot hold it, or why
# eager itself cannot run under it. A component that may ignore one context says so in ALLOWED as
# (component, "caller context: <name>").
NOT_DRAWN: dict[str, str] = {
    "torch.is_grad_enabled": "drawn already, as the calling mode (CALLING_MODES)",
    "torch._C._is_fwd_grad_enabled": "forward-mode AD is entered through torch.autograd.forward_ad, never set bare",
    "torch._C._get_cublas_allow_tf32": "a legacy TF32 flag: setting it (and setting it back) also writes the newer "
                                       "fp32_precision state, which no getter of the legacy API reads back; beside "
                                       "float32_matmul_precision, torch then refuses to read the precision, in eager's "
                                       "own matmuls too, for the rest of the process",
    "torch._C._get_cudnn_allow_tf32": "a legacy TF32 flag, as torch._C._get_cublas_allow_tf32",
    "torch.backends.cudnn.allow_tf32": "a legacy TF32 flag, as torch._C._get_cublas_allow_tf32",
    "torch.get_num_interop_threads": "torch takes it once per process, before any inter-op work: no caller can set it "
                                     "around a call (and trying it would change it for the rest of the run)",
}
